"""What a storage glob, a catalog schema or a share holds now: S3 listed by Python (pyarrow, with the
endpoint and keys Spark is given), other storage through Hadoop's FileSystem (with the credentials Spark
reads with), a schema through Spark's catalog, a share through its server's listings. The port is
fleet/serviceports.py's TableListing; which of these tables a pattern replicates is fleet/discovery.py's."""

from __future__ import annotations

import fnmatch
from urllib.parse import urlsplit

from cdc2ch.model.objectstore import S3Settings
from cdc2ch.model.tableref import DELTA_LOG, normalize_uri, quote_name
from cdc2ch.source.deltalog.logfiles import s3_filesystem
from cdc2ch.source.spark.lazysession import s3_settings, session_of

GLOB_CHARS = "*?["
# Glob syntax only Hadoop's matcher reads ({a,b}, [^a], escapes): such a glob is listed by Hadoop.
HADOOP_ONLY = ("{", "[^", "\\")


class LakeTables:
    """Listings on one Spark session (a session, a LazySpark or a function returning one), started only when
    a listing needs it."""

    def __init__(self, spark):
        self.spark = spark

    def directories(self, glob: str, why: str) -> list[tuple[str, str, str, bool]]:
        """(table, name, parent's name, whether it is a Delta table) of each directory `glob` matches. Local
        directories keep the plain absolute path `--table /lake/t` would have (a pipeline's identity). S3 is
        listed without a JVM where pyarrow reaches it; where it cannot (or the glob is Hadoop's own
        syntax), Hadoop lists it, and says what is wrong."""
        try:
            listed = s3_directories(glob, s3_settings(self.spark))
        except OSError:  # refused, unreachable: Hadoop's listing gives the paragraph storage errors get
            listed = None
        if listed is not None:
            return listed
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


def s3_directories(glob: str, s3: S3Settings) -> list[tuple[str, str, str, bool]] | None:
    """What LakeTables.directories gives for an s3:// or s3a:// `glob`, listed through pyarrow as Hadoop's
    glob lists it (each path segment matched alone, directories only; tables named s3a://, as every S3
    table is); None for other storage and for Hadoop-only syntax. One listing per directory a segment is
    matched in, and one per match for its log."""
    parts = urlsplit(normalize_uri(glob))
    if parts.scheme != "s3a" or any(mark in parts.path for mark in HADOOP_ONLY):
        return None
    import pyarrow.fs as pafs

    fs = s3_filesystem(s3)
    segments = [s for s in parts.path.split("/") if s]
    fixed = next((i for i, s in enumerate(segments) if any(c in s for c in GLOB_CHARS)), len(segments))
    level = ["/".join([parts.netloc, *segments[:fixed]])]
    for segment in segments[fixed:]:
        below = []
        for directory in level:
            listed = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
            below += [
                info.path
                for info in listed
                if info.type == pafs.FileType.Directory and fnmatch.fnmatchcase(info.base_name, segment)
            ]
        level = below
    out = []
    for path in sorted(level):
        names = path.rstrip("/").split("/")
        log = fs.get_file_info(pafs.FileSelector(f"{path}/{DELTA_LOG}", allow_not_found=True))
        parent = names[-2] if len(names) > 2 else ""  # (a directory at the bucket's root has none)
        out.append((f"s3a://{path}", names[-1], parent, bool(log)))
    return out
