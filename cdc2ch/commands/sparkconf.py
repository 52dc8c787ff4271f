"""`cdc2ch spark-conf`: the settings of cdc2ch's own Spark session that read and write Delta tables, written
out for a Spark of one's own (spark-submit, pyspark, a notebook) that writes the tables cdc2ch replicates."""

from __future__ import annotations

import json


def render(conf: dict[str, str], fmt: str) -> str:
    """`conf` (spark.jars, then Spark settings) as spark-submit/pyspark arguments on one line, to be spliced in
    with $(cdc2ch spark-conf); or as Python building a SparkSession with them."""
    jars, settings = conf["spark.jars"], {k: v for k, v in conf.items() if k != "spark.jars"}
    if fmt != "python":
        return " ".join([f"--jars {jars}", *(f"--conf {k}={v}" for k, v in settings.items())])
    # json.dumps quotes as Python does: any path is a valid string literal
    lines = ["from pyspark.sql import SparkSession", "", "jars = ["]
    lines += [f"    {json.dumps(jar)}," for jar in jars.split(",") if jar]
    lines += ["]", "spark = (", "    SparkSession.builder", '    .config("spark.jars", ",".join(jars))']
    lines += [f"    .config({json.dumps(k)}, {json.dumps(v)})" for k, v in settings.items()]
    return "\n".join([*lines, "    .getOrCreate()", ")"])
