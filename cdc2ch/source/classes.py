"""A class data sharing archive for the local Spark JVM: the classes Spark, Delta and Parquet load, kept
mapped from one file instead of read from jars, checked and linked again by every process.

A JVM that finds no archive for its exact classpath records what it loads and, at the end of a process that
ran Spark jobs, dumps it (`jcmd VM.cds dynamic_dump`, through the JVM's own diagnostic command bean). Later
processes map it: Spark starts ~3.5 s sooner and the first CDF read, which loads the read path, ~2.5 s
sooner (bench/results.md). The archive is keyed by the java binary, pyspark and every jar on the session's
classpath: another JDK, install or jar set gets its own archive, never a mismatched one. It lives next to
the Delta jars; `CDC2CH_CLASS_ARCHIVE=off` turns it off.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import time
from pathlib import Path

ENV = "CDC2CH_CLASS_ARCHIVE"
KEEP = 3  # archives kept per cache directory (~140 MiB each)
# The JVM's cds logging (classes it skips while dumping, an archive it cannot map) is for JVM developers:
# a rejected archive only means an ordinary start.
QUIET = "-Xlog:cds=off,cds+dynamic=off,cds+map=off,class+path=off"


def enabled() -> bool:
    return os.environ.get(ENV, "on").lower() not in ("off", "0", "false", "no")


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_path(directory: Path, jars: list[str]) -> Path | None:
    """Where the archive for this JVM and classpath lives (None: no java binary to key it by)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for part in [java, pyspark.__file__, pyspark.__version__, *sorted(jars)]:
        try:
            st = os.stat(part)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = ""
        digest.update(f"{part}\0{stamp}\n".encode())
    return directory / f"classes-{digest.hexdigest()[:16]}.jsa"


def java_options(archive: Path) -> str:
    """Map the archive when it exists, else record what is loaded so that it can be dumped."""
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"
    return f"-XX:+RecordDynamicDumpInfo {QUIET}"


def save_at_exit(spark, archive: Path, log) -> None:
    """At the end of this process, dump the classes its JVM loaded to `archive` (written under another name,
    then renamed: a concurrent process or a crash never leaves a partial archive at that path)."""

    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")

    def save() -> None:
        try:
            if archive.exists() or not spark.sparkContext.statusTracker().getJobIdsForGroup():
                return  # another process saved it, or this one never ran the read path
            t0 = time.monotonic()
            _dynamic_dump(spark, partial)
            os.replace(partial, archive)
            _prune(archive.parent)
            log.info(
                "class_archive_saved",
                path=str(archive),
                mib=archive.stat().st_size >> 20,
                seconds=round(time.monotonic() - t0, 1),
            )
        except Exception as exc:  # only a slower start for the next process
            partial.unlink(missing_ok=True)
            log.debug("class_archive_not_saved", reason=str(exc).splitlines()[0][:300])

    atexit.register(save)


def _prune(directory: Path) -> None:
    """Keep the newest KEEP archives: other JDKs or installs sharing this cache keep theirs, old jar sets go."""
    found = sorted(directory.glob("classes-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[KEEP:]:
        old.unlink(missing_ok=True)


def _dynamic_dump(spark, path: Path) -> None:
    """`jcmd <pid> VM.cds dynamic_dump <path>`, run in the JVM itself (no JDK tools needed). The platform
    MBean server's class is not exported to py4j: its public interface's method is invoked instead."""
    gateway, jvm = spark.sparkContext._gateway, spark._jvm
    lang = jvm.java.lang

    def array(cls, items):
        out = gateway.new_array(cls, len(items))
        for i, item in enumerate(items):
            out[i] = item
        return out

    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    types = ["javax.management.ObjectName", "java.lang.String", "[Ljava.lang.Object;", "[Ljava.lang.String;"]
    invoke = lang.Class.forName("javax.management.MBeanServer").getMethod(
        "invoke", array(lang.Class, [lang.Class.forName(t) for t in types])
    )
    bean = jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand")
    command = array(lang.String, ["dynamic_dump", str(path)])
    signature = array(lang.String, ["[Ljava.lang.String;"])
    invoke.invoke(server, array(lang.Object, [bean, "vmCds", array(lang.Object, [command]), signature]))
    if not path.exists():
        raise RuntimeError(f"the JVM wrote no archive at {path}")
