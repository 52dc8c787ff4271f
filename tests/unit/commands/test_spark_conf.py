"""`cdc2ch spark-conf`: the Delta settings of cdc2ch's own session, as flags for spark-submit/pyspark and as
Python, each saying the same."""

from __future__ import annotations

import ast

from click.testing import CliRunner

from cdc2ch.cli import main
from cdc2ch.commands.sparkconf import render
from cdc2ch.source.spark.session import DELTA_CONF

JARS = ["/cache/jars/delta-spark.jar", "/cache/jars/delta-storage.jar"]
DELTA = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
FLAGS = ["--jars", ",".join(JARS), *(x for k, v in DELTA.items() for x in ("--conf", f"{k}={v}"))]


def test_the_flags_are_the_settings_of_cdc2chs_own_session(monkeypatch):
    monkeypatch.setenv(
        "CDC2CH_DELTA_JARS", ",".join(JARS)
    )  # the jars its session loads, here without a fetch
    result = CliRunner().invoke(main, ["spark-conf"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == FLAGS  # as a shell splits $(cdc2ch spark-conf)
    assert result.stderr == ""
    assert DELTA.items() <= DELTA_CONF.items()


def test_python_says_what_the_flags_say():
    code = render({"spark.jars": ",".join(JARS), **DELTA}, "python")
    tree = ast.parse(code)  # valid Python as printed
    jars = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "jars")  # type: ignore[attr-defined]
    assert ast.literal_eval(jars) == JARS
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "config"]
    settings = {ast.literal_eval(c.args[0]): c.args[1] for c in calls}
    assert ast.unparse(settings.pop("spark.jars")) == "','.join(jars)"
    assert {k: ast.literal_eval(v) for k, v in settings.items()} == DELTA
    assert code.endswith("    .getOrCreate()\n)")
