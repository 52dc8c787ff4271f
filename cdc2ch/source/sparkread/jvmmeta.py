"""A Delta table's metadata read through Delta's own log object in the JVM: for tables whose log Python does
not read (storage only Spark reaches). Each falls back to the documented DESCRIBE DETAIL where another Delta
release's internal signature differs."""

from __future__ import annotations

import json

from cdc2ch.source.sparkread.cdfscan import delta_log


def jvm_properties(source) -> dict[str, str]:
    """The table properties of a DeltaSource's latest version."""
    try:
        conf = source._jvm_snapshot().metadata().configuration()
        return dict(source.spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(conf))
    except Exception:  # another Delta release with another internal signature: the documented way
        detail = source._delta_table().detail().select("properties").collect()[0]
        return dict(detail["properties"] or {})


def jvm_table_id(source) -> str:
    """The table id (metaData.id) of a DeltaSource."""
    try:
        return str(source._jvm_snapshot().metadata().id())
    except Exception:
        return str(source._delta_table().detail().select("id").collect()[0]["id"] or "")


def logged_schema(spark, location: str, version: int) -> dict | None:
    """The schema at `version` as Delta's log records it (column mapping metadata included), or None where
    this Delta release's internal signature differs."""
    try:
        none = spark._jvm.scala.Option.empty()
        found = delta_log(spark, location).getSnapshotAt(int(version), none, none, False)
        return json.loads(found.metadata().schemaString())
    except Exception:
        return None


def protocol(source) -> dict:
    """The latest protocol of a DeltaSource (DeltaSource.protocol)."""
    try:
        proto = source._jvm_snapshot().protocol()
        as_java = source.spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava
        return {
            "minReaderVersion": int(proto.minReaderVersion()),
            "minWriterVersion": int(proto.minWriterVersion()),
            "readerFeatures": sorted(as_java(proto.readerFeatureNames())),
            "writerFeatures": sorted(as_java(proto.writerFeatureNames())),
        }
    except Exception:  # another Delta release with another internal signature: the documented way
        detail = source._delta_table().detail().collect()[0]
        features = sorted(detail["tableFeatures"] or [])
        return {
            "minReaderVersion": int(detail["minReaderVersion"]),
            "minWriterVersion": int(detail["minWriterVersion"]),
            "readerFeatures": features,  # DESCRIBE DETAIL does not tell reader from writer features
            "writerFeatures": features,
        }
