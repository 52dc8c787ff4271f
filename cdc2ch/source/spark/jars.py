"""The jars Spark reads with, fetched from Maven Central once and cached: Delta Lake, and the storage
connectors object-storage tables need (S3, Azure, Google Cloud Storage).

Each set is resolved through Spark's own Ivy (or Maven as a fallback) into a directory of the cache, and
every later session loads it from there (session.py's `jar_conf` says how): no network and no resolution
chatter after the first run. `python -m cdc2ch.source.spark.session` fills the cache ahead of time (`make
demo` and `make install` do); with `s3`, `azure` or `gcs` as arguments, those connectors too.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.objectstore import CONNECTORS


@dataclass(frozen=True)
class Connector:
    """A Hadoop FileSystem for one kind of object storage, as Maven packages."""

    name: str
    packages: tuple[str, ...]
    filesystem: str  # the class that reads its URIs: its absence from the JVM means the jars are missing
    excludes: tuple[str, ...] = ()  # what Spark already ships, or what is only loaded when configured
    conf: tuple[tuple[str, str], ...] = ()  # settings it needs to be found for its schemes


@functools.cache
def hadoop_version() -> str:
    """The version of the Hadoop client Spark ships: connectors must match it."""
    import pyspark

    for jar in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-") : -len(".jar")]
    raise ConfigError(
        "The installed pyspark has no hadoop-client-api jar, so cdc2ch cannot tell which Hadoop connectors "
        "match it. Reinstall pyspark (pip install --force-reinstall pyspark), or put the storage connector's "
        "jars on Spark's classpath yourself with --spark-conf spark.jars=…"
    )


GCS_CONNECTOR = "com.google.cloud.bigdataoss:gcs-connector:hadoop3-2.2.26"
KNOWN = tuple(dict.fromkeys(CONNECTORS.values()))  # s3, azure, gcs


def connector(name: str) -> Connector:
    """The connector called `name` (s3, azure or gcs; see model/objectstore.CONNECTORS)."""
    hadoop = hadoop_version()
    if name == "s3":
        return Connector(
            "s3",
            (f"org.apache.hadoop:hadoop-aws:{hadoop}",),
            "org.apache.hadoop.fs.s3a.S3AFileSystem",
        )
    if name == "azure":
        return Connector(
            "azure",
            (f"org.apache.hadoop:hadoop-azure:{hadoop}",),
            "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem",
            excludes=("commons-logging:commons-logging",),
        )
    if name == "gcs":
        return Connector(
            "gcs",
            (GCS_CONNECTOR,),
            "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
            conf=(
                ("spark.hadoop.fs.gs.impl", "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"),
                (
                    "spark.hadoop.fs.AbstractFileSystem.gs.impl",
                    "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
                ),
            ),
        )
    raise ConfigError(
        f"{name!r} is not a storage connector cdc2ch knows. Name s3, azure or gcs in spark.cdc2ch.connectors, "
        f"or put another connector's jars on Spark's classpath with --spark-conf spark.jars.packages=…"
    )


def delta_artifact() -> str:
    """The Maven coordinate of the Delta jar matching the installed pyspark and delta-spark."""
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_2.13:{metadata.version('delta-spark')}"


def jars_dir() -> Path:
    """The Delta jars' directory (the class archive is kept there too); connectors in its `connectors/`."""
    base = os.environ.get("CDC2CH_JARS_DIR")
    if base:
        return Path(base).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cdc2ch" / "jars" / delta_artifact().replace(":", "_")


def delta_jars() -> list[str]:
    """Local paths of the Delta jars, fetching them on first use."""
    if os.environ.get("CDC2CH_DELTA_JARS"):  # an air-gapped site can point at jars it ships itself
        return [j for j in os.environ["CDC2CH_DELTA_JARS"].split(",") if j]
    return _cached(jars_dir(), (delta_artifact(),), (), "the Delta Lake jars")


def delta_jars_cached() -> bool:
    """Whether delta_jars() answers from the cache, without fetching anything."""
    return bool(os.environ.get("CDC2CH_DELTA_JARS")) or (jars_dir() / ".complete").exists()


def connector_dir(found: Connector) -> Path:
    return jars_dir() / "connectors" / "_".join(p.replace(":", "_") for p in found.packages)


def connectors_in_use(names: frozenset[str]) -> list[Connector]:
    """The connectors `names`, with those fetched before: a catalog table on storage a connector was fetched
    for then reads without naming it."""
    named = [connector(n) for n in sorted(names)]
    fetched = [connector(n) for n in KNOWN if n not in names]
    return named + [c for c in fetched if (connector_dir(c) / ".complete").exists()]


def connector_jars(found: list[Connector]) -> list[str]:
    """Local paths of the jars of the connectors `found`, fetching the missing on first use."""
    jars: list[str] = []
    for c in found:
        jars += _cached(connector_dir(c), c.packages, c.excludes, f"the {c.name} connector")
    return jars


def connector_conf(found: list[Connector]) -> dict[str, str]:
    """The settings the connectors `found` need."""
    return {key: value for c in found for key, value in c.conf}


def _cached(target: Path, packages: tuple[str, ...], excludes: tuple[str, ...], what: str) -> list[str]:
    marker = target / ".complete"
    if not marker.exists():
        _fetch(target, packages, excludes, what)
        marker.write_text("\n".join(packages) + "\n")
    return sorted(str(p) for p in target.glob("*.jar"))


def _fetch(target: Path, packages: tuple[str, ...], excludes: tuple[str, ...], what: str) -> None:
    errors = []
    main = packages[0].split(":")[1]
    for how in (_fetch_with_ivy, _fetch_with_maven):
        with tempfile.TemporaryDirectory(prefix="cdc2ch-jars-") as tmp:
            try:
                jars = how(Path(tmp), packages, excludes)
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                errors.append(f"{how.__name__}: {str(exc)[-600:]}")
                continue
            if not any(main in j.name for j in jars):
                errors.append(f"{how.__name__}: no {main} jar among {[j.name for j in jars]}")
                continue
            target.mkdir(parents=True, exist_ok=True)
            for jar in jars:
                shutil.copy2(jar, target / jar.name)
            return
    raise ConfigError(
        f"Could not fetch {what} ({', '.join(packages)}) from Maven Central. Tried: "
        + " | ".join(errors)
        + ". Check network access to Maven Central, or download the jars yourself and pass them with "
        "--spark-conf spark.jars=<comma-separated paths> (for Delta itself, CDC2CH_DELTA_JARS)."
    )


def _fetch_with_ivy(tmp: Path, packages: tuple[str, ...], excludes: tuple[str, ...]) -> list[Path]:
    """Spark's standard route: spark-submit --packages resolves through Ivy into tmp/ivy/jars."""
    import pyspark

    app = tmp / "noop.py"
    app.write_text("pass\n")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_HOME=str(submit.parent.parent))
    command = [str(submit), "--master", "local[1]", "--packages", ",".join(packages)]
    command += ["--conf", f"spark.jars.ivy={tmp / 'ivy'}"]
    if excludes:
        command += ["--exclude-packages", ",".join(excludes)]
    proc = subprocess.run([*command, str(app)], capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr or proc.stdout)
    return sorted((tmp / "ivy" / "jars").glob("*.jar"))


def _fetch_with_maven(tmp: Path, packages: tuple[str, ...], excludes: tuple[str, ...]) -> list[Path]:
    """Fallback: Maven copies the packages and their runtime dependencies (Spark itself is provided)."""
    exclusions = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
        for g, a in (e.split(":") for e in excludes)
    )
    dependencies = ""
    for package in packages:
        group, artifact, version = package.split(":")
        dependencies += (
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version><exclusions>{exclusions}</exclusions></dependency>"
        )
    (tmp / "pom.xml").write_text(
        "<project><modelVersion>4.0.0</modelVersion><groupId>local</groupId><artifactId>cdc2ch-jars</artifactId>"
        f"<version>1</version><dependencies>{dependencies}</dependencies></project>"
    )
    proc = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(tmp / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp / 'jars'}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout + proc.stderr)
    return sorted((tmp / "jars").glob("*.jar"))
