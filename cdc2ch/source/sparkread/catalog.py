"""A catalog table name resolved through the Spark session's catalog (Hive metastore, Unity Catalog, Glue...)
to its full name and storage location. Only the catalog is asked (DESCRIBE TABLE EXTENDED): no Spark job,
no file listing."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cdc2ch.base.errors import SourceError, summarise
from cdc2ch.model.tableref import TableRef, display_name

_NOT_FOUND = (
    "TABLE_OR_VIEW_NOT_FOUND",
    "SCHEMA_NOT_FOUND",
    "NoSuchTable",
    "NoSuchDatabase",
    "NoSuchNamespace",
)
_NO_CATALOG = ("CATALOG_NOT_FOUND", "CatalogNotFound")
CONFIGURE = (
    "cdc2ch finds names in the catalog of its Spark session, configured with --spark-conf (or [spark-conf] in "
    "the config file): a Hive metastore with spark.sql.catalogImplementation=hive and "
    "spark.hadoop.hive.metastore.uris=thrift://HOST:9083, AWS Glue with spark.sql.catalogImplementation=hive "
    "and spark.hadoop.hive.metastore.client.factory.class=com.amazonaws.glue.catalog.metastore."
    "AWSGlueDataCatalogHiveClientFactory, Unity Catalog with spark.sql.catalog.NAME=io.unitycatalog.spark."
    "UCSingleCatalog and its .uri and .token (docs/guides/catalog.md)."
)


@dataclass(frozen=True)
class Resolved:
    name: str  # catalog.schema.table, as the catalog names it
    location: str  # where the table's files (and _delta_log) are


def resolve(spark, ref: TableRef) -> Resolved:
    """The table `ref` names, or SourceError: no such table (saying where it looked), a view, not Delta."""
    parts = ref.parts or ()
    catalog = parts[0] if len(parts) == 3 else _current_catalog(spark)
    where = f"schema {display_name([catalog, parts[-2]])}"
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {ref.sql()}").collect()
    except Exception as exc:
        text = str(exc)
        if any(code in text for code in _NO_CATALOG):
            raise SourceError(
                f"--table {ref.text}: Spark has no catalog named {parts[0]!r} (it would be configured with "
                f"spark.sql.catalog.{parts[0]}=...). {CONFIGURE}{_directory_hint(ref)}"
            ) from None
        if any(code in text for code in _NOT_FOUND):
            raise SourceError(
                f"--table {ref.text}: there is no table {display_name(parts[-2:])} in {where} of catalog "
                f"{catalog!r} (this session's built-in catalog is "
                f"{_conf(spark, 'spark.sql.catalogImplementation', 'in-memory')}). Check the name, or the "
                f"catalog settings: {CONFIGURE}{_directory_hint(ref)}"
            ) from None
        first = next((ln for ln in text.splitlines() if ln.strip()), text)
        raise SourceError(
            f"--table {ref.text}: looking the table up in catalog {catalog!r} failed: {summarise(first, 400)}"
        ) from None
    info = _details(rows)
    name = _full_name(info, catalog, parts)
    kind = info.get("type", "").upper()
    if "VIEW" in kind:
        raise SourceError(
            f"--table {ref.text}: {name} is a view. cdc2ch replicates a Delta table through its Change Data "
            f"Feed, which a view does not have: name the Delta table the view reads."
        )
    provider = info.get("provider", "").lower()
    location = info.get("location", "")
    if provider != "delta" or not location:
        what = f"a {provider or 'non-Delta'} table" if provider != "delta" else "a table without a location"
        raise SourceError(
            f"--table {ref.text}: {name} is {what}, not a Delta table. cdc2ch replicates Delta tables (with "
            f"delta.enableChangeDataFeed = true)."
        )
    return Resolved(name, location)


def _details(rows) -> dict[str, str]:
    """DESCRIBE TABLE EXTENDED's detail section, keys lower-cased (Catalog, Database, Table, Name, Type...)."""
    out: dict[str, str] = {}
    detailed = False
    for row in rows:
        key, value = (row[0] or "").strip(), (row[1] or "").strip()
        if key.startswith("# Detailed Table Information"):
            detailed = True
        elif detailed and key and not key.startswith("#"):
            out.setdefault(key.lower(), value)
    return out


def _full_name(info: dict[str, str], catalog: str, parts: tuple[str, ...]) -> str:
    if info.get("database") and info.get("table"):
        return display_name([info.get("catalog") or catalog, info["database"], info["table"]])
    name = info.get("name", "")
    if name.count(".") >= 1 and "`" not in name:
        pieces = name.split(".")
        return display_name(pieces if len(pieces) == 3 else [catalog, *pieces])
    return display_name([catalog, *parts[-2:]])


def _current_catalog(spark) -> str:
    try:
        return spark.catalog.currentCatalog()
    except Exception:
        return "spark_catalog"


def _conf(spark, key: str, default: str) -> str:
    try:
        return spark.sparkContext.getConf().get(key, default)
    except Exception:
        return default


def _directory_hint(ref: TableRef) -> str:
    """For `orders.delta` when a directory of that name is here: how to mean the directory."""
    return f" If you meant the directory {ref.text}, write ./{ref.text}." if os.path.isdir(ref.text) else ""
