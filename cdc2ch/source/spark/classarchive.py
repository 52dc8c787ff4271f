"""A class data sharing archive for the local Spark JVM: the classes Spark, Delta and Parquet load, kept
mapped from one file instead of read from jars, checked and linked again by every process.

A JVM that finds no archive for its exact classpath dumps what it loaded as it exits
(`-XX:ArchiveClassesAtExit`), at the end of a process that ran Spark jobs. Later processes map it: Spark
starts ~3.5 s sooner and the first CDF read, which loads the read path, ~2.5 s sooner (bench/results.md). The
archive is keyed by the java binary, pyspark and every jar on the session's classpath: another JDK, install
or jar set gets its own archive, never a mismatched one. It lives next to the Delta jars;
`CDC2CH_CLASS_ARCHIVE=off` turns it off.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import time
from pathlib import Path

from cdc2ch.base.processes import process_gone

ENV = "CDC2CH_CLASS_ARCHIVE"
KEEP = 3  # archives kept per cache directory (~170 MiB each)
DUMP_TIMEOUT = 300  # seconds a JVM may take to stop and write its archive at exit (14-16 s here)
# The JVM's cds logging (classes it skips while dumping, an archive it cannot map) is for JVM developers:
# a rejected archive only means an ordinary start.
QUIET = "-Xlog:cds=off,cds+dynamic=off,cds+map=off,class+path=off"


def enabled() -> bool:
    return os.environ.get(ENV, "on").lower() not in ("off", "0", "false", "no")


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_path(directory: Path, jars: list[str], class_path: list[str] | None = None) -> Path | None:
    """Where the archive for this JVM, these `jars` (loaded by Spark) and this `class_path` lives (None: no
    java binary to key it by). A jar moved between the two is another archive: the JVM rejects the old."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for part in [
        java,
        pyspark.__file__,
        pyspark.__version__,
        *sorted(jars),
        *(["--class-path", *class_path] if class_path else []),
    ]:
        try:
            st = os.stat(part)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = ""
        digest.update(f"{part}\0{stamp}\n".encode())
    return directory / f"classes-{digest.hexdigest()[:16]}.jsa"


def java_options(archive: Path) -> str:
    """Map the archive when it exists, else have the JVM dump one when it exits (see save_at_exit). Either way
    the dumps that were never renamed go first: each is as large as an archive."""
    _prune(archive.parent)
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"
    return f"-XX:ArchiveClassesAtExit={_partial(archive)} {QUIET}"


def _partial(archive: Path) -> Path:
    """Where this process's JVM dumps: renamed to `archive` once complete, so no process maps half of one."""
    return archive.with_name(f"{archive.name}.{os.getpid()}.partial")


def save_at_exit(spark, archive: Path, log) -> None:
    """At the end of this process, let its JVM dump the classes it loaded to `archive`: stop it, wait while it
    writes, then rename. The JVM links every class it loaded before dumping at its exit, those the bytecode
    verifier only loaded to check other classes among them (a third of a read's: on a dump requested while it
    runs, `jcmd VM.cds dynamic_dump`, JDK 17 leaves them out, and every later JVM loaded them from the jars
    again, W5's start and plan about a second slower). A JVM that never ran the read path, or finds the
    archive saved meanwhile, is not waited for: its dump is never renamed, and pruned later."""

    def save() -> None:
        partial = _partial(archive)
        try:
            if archive.exists() or not spark.sparkContext.statusTracker().getJobIdsForGroup():
                return  # another process saved it, or this one never ran the read path (or stopped Spark)
            t0 = time.monotonic()
            proc = spark.sparkContext._gateway.proc
            spark.stop()
            proc.stdin.close()  # the gateway ends its JVM when its input closes; the JVM dumps as it exits
            proc.wait(timeout=DUMP_TIMEOUT)
            if proc.returncode != 0 or not partial.exists():
                raise RuntimeError(f"the JVM ended with {proc.returncode} and wrote no archive at {partial}")
            os.replace(partial, archive)
            _prune(archive.parent)
            log.info(
                "class_archive_saved",
                path=str(archive),
                mib=archive.stat().st_size >> 20,
                seconds=round(time.monotonic() - t0, 1),
            )
        except Exception as exc:  # only a slower start for the next process
            log.debug("class_archive_not_saved", reason=str(exc).splitlines()[0][:300])

    atexit.register(save)


def _prune(directory: Path) -> None:
    """Keep the newest KEEP archives: other JDKs or installs sharing this cache keep theirs, old jar sets go.
    Dumps of processes that have ended (unwanted, or cut short) go too."""
    found = sorted(directory.glob("classes-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[KEEP:]:
        old.unlink(missing_ok=True)
    for partial in directory.glob("classes-*.jsa.*.partial"):
        pid = partial.name.split(".")[-2]
        if pid.isdigit() and process_gone(int(pid)):
            partial.unlink(missing_ok=True)
