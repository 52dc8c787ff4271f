"""Storage connectors: which Maven packages each is, where they are cached, and where a JVM gets them."""

from __future__ import annotations

import os

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.source.spark import jars
from cdc2ch.source.spark.session import jar_conf


def test_each_connector_matches_spark_s_hadoop_and_names_the_class_that_proves_it():
    hadoop = jars.hadoop_version()
    assert hadoop.count(".") == 2 and hadoop[0] == "3"
    s3, azure, gcs = (jars.connector(n) for n in ("s3", "azure", "gcs"))
    assert s3.packages == (f"org.apache.hadoop:hadoop-aws:{hadoop}",)
    assert s3.filesystem == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert azure.packages == (f"org.apache.hadoop:hadoop-azure:{hadoop}",)
    assert gcs.packages == (jars.GCS_CONNECTOR,)
    assert dict(gcs.conf)["spark.hadoop.fs.gs.impl"] == gcs.filesystem
    with pytest.raises(ConfigError, match="s3, azure or gcs"):
        jars.connector("hdfs")


def test_connectors_come_from_the_cache_and_a_fetched_one_stays_on_the_class_path(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC2CH_JARS_DIR", str(tmp_path))
    fetched = []

    def fetch(target, packages, excludes, what):
        fetched.append(packages)
        target.mkdir(parents=True)
        (target / f"{packages[0].split(':')[1]}.jar").write_text("")

    monkeypatch.setattr(jars, "_fetch", fetch)

    def jars_of(names):
        return jars.connector_jars(jars.connectors_in_use(frozenset(names)))

    assert jars.connectors_in_use(frozenset()) == [] and jars_of(()) == []
    s3 = jars_of({"s3"})
    assert [os.path.basename(j) for j in s3] == ["hadoop-aws.jar"] and len(fetched) == 1
    assert s3[0].startswith(str(tmp_path / "connectors") + os.sep)
    # fetched once; then on every JVM's class path, named or not (a catalog table on S3 needs it too)
    assert jars_of(()) == s3 and len(fetched) == 1
    both = jars_of({"gcs"})
    assert sorted(os.path.basename(j) for j in both) == ["gcs-connector.jar", "hadoop-aws.jar"]
    assert jars.connector_conf(jars.connectors_in_use(frozenset({"gcs"}))) == dict(jars.connector("gcs").conf)
    assert jars.connector_conf([jars.connector("s3")]) == {}
    with pytest.raises(ConfigError, match="s3, azure or gcs"):
        jars.connectors_in_use(frozenset({"hdfs"}))


def test_a_local_jvm_has_its_connectors_on_its_class_path_from_the_start():
    delta, connectors = ["/c/delta.jar"], ["/c/aws.jar", "/c/sdk.jar"]
    assert jar_conf(delta, connectors, True, {}) == {
        "spark.jars": "/c/delta.jar",
        "spark.driver.extraClassPath": os.pathsep.join(connectors),
    }
    # a cluster's executors get them as they get Delta's; so does a JVM whose class path the user set
    shipped = {"spark.jars": "/c/delta.jar,/c/aws.jar,/c/sdk.jar"}
    assert jar_conf(delta, connectors, False, {}) == shipped
    assert jar_conf(delta, connectors, True, {"spark.driver.extraClassPath": "/mine.jar"}) == shipped
    assert jar_conf(delta, [], True, {}) == {"spark.jars": "/c/delta.jar"}
