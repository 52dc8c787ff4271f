"""Which JVM gets a class data sharing archive, and which archive: decided before any JVM starts."""

from __future__ import annotations

import os
import subprocess

from cdc2ch.source.spark import classarchive as classes
from cdc2ch.source.spark import session as spark


def _gone_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _ours(jars: list[str]) -> dict[str, str]:
    return {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "spark.jars": ",".join(jars)}


def test_the_archive_is_keyed_by_the_classpath(tmp_path):
    one, two = tmp_path / "a.jar", tmp_path / "b.jar"
    one.write_bytes(b"a")
    two.write_bytes(b"b")
    same = classes.archive_path(tmp_path, [str(one), str(two)])
    assert same == classes.archive_path(tmp_path, [str(two), str(one)])  # order does not matter
    assert same.parent == tmp_path and same.name.startswith("classes-") and same.suffix == ".jsa"
    assert classes.archive_path(tmp_path, [str(one)]) != same  # another jar set
    assert classes.archive_path(tmp_path, [str(one)], [str(two)]) != same  # one on the class path instead
    two.write_bytes(b"bb")  # the same jar name, rebuilt
    assert classes.archive_path(tmp_path, [str(one), str(two)]) != same


def test_a_missing_archive_is_dumped_at_exit_an_existing_one_mapped(tmp_path):
    archive = tmp_path / "classes-x.jsa"
    options = classes.java_options(archive)
    assert f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.partial" in options  # renamed when complete
    assert "SharedArchiveFile" not in options
    archive.write_bytes(b"")
    left = tmp_path / f"classes-x.jsa.{_gone_pid()}.partial"  # a dump no process will rename
    left.write_bytes(b"")
    options = classes.java_options(archive)
    assert f"-XX:SharedArchiveFile={archive}" in options and "-Xshare:auto" in options
    assert "ArchiveClassesAtExit" not in options
    assert not left.exists()


def test_no_archive_when_the_user_chose_the_jvm_the_jars_or_turned_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC2CH_JARS_DIR", str(tmp_path))
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"d")
    assert spark._class_archive(_ours([str(jar)]), {}).parent == tmp_path
    # the path bench/ looks for is the one the session uses
    assert spark.class_archive([str(jar)]) == spark._class_archive(_ours([str(jar)]), {})
    for key in ("spark.driver.extraJavaOptions", "spark.driver.extraClassPath", "spark.jars.packages"):
        assert spark._class_archive(_ours([str(jar)]), {key: "x"}) is None, key
    assert spark._class_archive({"spark.jars": str(jar)}, {}) is None  # not a local JVM of ours
    monkeypatch.setenv("CDC2CH_CLASS_ARCHIVE", "off")
    assert spark._class_archive(_ours([str(jar)]), {}) is None
    assert spark.class_archive([str(jar)]) is None


def test_the_newest_archives_are_kept_and_ended_processes_dumps_go(tmp_path):
    for age in range(5):
        old = tmp_path / f"classes-{age}.jsa"
        old.write_bytes(b"")
        os.utime(old, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "delta.jar").write_bytes(b"d")
    (tmp_path / f"classes-9.jsa.{_gone_pid()}.partial").write_bytes(b"")  # its process ended: never renamed
    (tmp_path / f"classes-9.jsa.{os.getpid()}.partial").write_bytes(b"")  # a dump under way
    classes._prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "classes-0.jsa", "classes-1.jsa", "classes-2.jsa", f"classes-9.jsa.{os.getpid()}.partial", "delta.jar"
    ]  # fmt: skip
