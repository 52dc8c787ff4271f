"""What a storage glob, a catalog schema or a share holds now: storage listed through Hadoop's FileSystem
(with the credentials Spark reads with), a schema through Spark's catalog, a share through its server's
listings. The port is fleet/serviceports.py's TableListing; which of these tables a pattern replicates is
fleet/discovery.py's."""

from __future__ import annotations

from cdc2ch.model.tableref import DELTA_LOG, normalize_uri, quote_name
from cdc2ch.source.spark.lazysession import session_of


class LakeTables:
    """Listings on one Spark session (a session, a LazySpark or a function returning one), started only when
    a listing needs it."""

    def __init__(self, spark):
        self.spark = spark

    def directories(self, glob: str, why: str) -> list[tuple[str, str, str, bool]]:
        """(table, name, parent's name, whether it is a Delta table) of each directory `glob` matches. Local
        directories keep the plain absolute path `--table /lake/t` would have (a pipeline's identity)."""
        spark = session_of(self.spark, why)
        jvm = spark._jvm
        text = normalize_uri(glob)
        pattern = jvm.org.apache.hadoop.fs.Path(text)
        fs = pattern.getFileSystem(spark._jsc.hadoopConfiguration())
        out = []
        for status in fs.globStatus(pattern) or []:
            if not status.isDirectory():
                continue
            path = status.getPath()
            uri = path.toUri()
            table = (
                uri.getPath() if uri.getScheme() in (None, "file") and "://" not in text else path.toString()
            )
            parent = path.getParent()
            delta = fs.exists(jvm.org.apache.hadoop.fs.Path(path, DELTA_LOG))
            out.append((table, path.getName(), parent.getName() if parent is not None else "", bool(delta)))
        return out

    def catalog(self, schema: tuple[str, ...], why: str) -> list[str]:
        """The names of the (not temporary) tables of a catalog schema; Spark's error when it cannot list it."""
        spark = session_of(self.spark, why)
        rows = spark.sql(f"SHOW TABLES IN {quote_name(schema)}").collect()
        return [r["tableName"] for r in rows if not r["isTemporary"]]

    def shared(self, profile: str, share: str, schema: str) -> list[tuple[str, str]]:
        """(schema, table) of each table of a share's schema, from the profile file at `profile`."""
        from cdc2ch.source.sharing.restclient import SharingClient, load_profile

        return SharingClient(load_profile(profile), share, schema, "*").tables()
