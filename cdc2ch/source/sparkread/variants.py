"""How a Delta VARIANT value travels to ClickHouse: as its JSON text, read by Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc2ch.model import contract, schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def variants_as_json(frame: DataFrame) -> DataFrame:
    """The frame with every VARIANT value, at any depth, as its JSON text (Spark's `to_json`): the form its
    ClickHouse String column keeps (schema.py). Spark cannot hand VARIANT values to Arrow at all, and a
    `CAST(v AS STRING)` would lose the quotes of a JSON string and turn a JSON null into NULL."""
    fields = frame.schema.jsonValue()["fields"]
    if not any(schema.contains_type(f["type"], "variant") for f in fields):
        return frame
    return frame.select(
        *[_json_variants(contract.spark_col(f["name"]), f["type"]).alias(f["name"]) for f in fields]
    )


def _json_variants(col, spark_type):
    from pyspark.sql import functions as F

    if not schema.contains_type(spark_type, "variant"):
        return col
    if spark_type == "variant":
        return F.to_json(col)
    kind = spark_type["type"]
    if kind == "array":
        return F.transform(col, lambda x: _json_variants(x, spark_type["elementType"]))
    if kind == "map":  # Spark allows no VARIANT map keys
        return F.transform_values(col, lambda _, v: _json_variants(v, spark_type["valueType"]))
    if kind == "struct":
        fields = [
            _json_variants(col.getField(f["name"]), f["type"]).alias(f["name"]) for f in spark_type["fields"]
        ]
        return F.when(col.isNull(), F.lit(None)).otherwise(F.struct(*fields))
    return col
