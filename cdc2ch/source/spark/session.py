"""A Spark session with Delta Lake enabled, and with the storage connectors its tables need (the jars come
from the cache jars.py fills; object-storage settings from model/objectstore.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import typing
from contextlib import contextmanager
from pathlib import Path

from cdc2ch.base.processes import kill_tree
from cdc2ch.base.stop import Stopped
from cdc2ch.model.config import SparkSettings, is_secret_key
from cdc2ch.model.objectstore import S3Settings, connectors_for
from cdc2ch.source.spark import classarchive
from cdc2ch.source.spark.jars import connector_conf, connector_jars, connectors_in_use, delta_jars, jars_dir
from cdc2ch.source.spark.lazysession import LazySpark, no_java

if typing.TYPE_CHECKING:
    from pyspark.sql import DataFrame

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # Pipelines of one process run side by side, each in a pool of its own (source/spark/threads.py): FAIR shares
    # the executors between the pools, where FIFO would let one table's load hold every core.
    "spark.scheduler.mode": "FAIR",
}
# What another Spark needs besides the Delta jars to read and write Delta tables as this session does
# (`cdc2ch spark-conf` prints them).
DELTA_SQL = ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
# Sensible for one machine; every key can be overridden with --spark-conf.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.driver.memory": "1g",  # ranges are bounded (--max-rows-per-read): enough, and the tree stays < 2 GiB
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    # A streamed range (threads.arrow_batches) reaches cdc2ch a task's rows at a time, each inserted as it
    # comes, from tasks small enough that holding a task's rows until it ends stays cheap (8 MB of files:
    # -100 MiB peak on W1 at 10x against 16 MB). Spark sends a task's rows only when it ends, so they come as
    # one Arrow batch (no limit): cut into inserts of about --batch-size (changes.batches), with no
    # remainder inserted alone, and cheaper to build than batches of 80,000 (W5: 20 inserts, not 40).
    "spark.sql.execution.arrow.maxRecordsPerBatch": "0",
    "spark.sql.files.maxPartitionBytes": "8m",
    # Joins hash their partitions where every one is small, else sort (and spill) rather than fail
    "spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold": "32m",
}


_started = None  # the session this module built, for later calls from any thread
_launched: subprocess.Popen | None = None  # spark-submit's process, known from the moment it starts
_given_up = False  # the start under way was abandoned: a launch not yet begun is ended as it begins
_launch_lock = threading.Lock()
STOP_SEEN = 0.1  # seconds at most between a stop and a start being abandoned
ABANDONED_WAIT = 5.0  # seconds the start's thread is given to notice its JVM gone


def session(settings: SparkSettings | None = None, stop: threading.Event | None = None):
    """The Spark session: reused when one is already running (tests, several pipelines, spark-submit).

    A new one is built on a helper thread: PySpark's SparkContext, created on the main thread, replaces the
    process's SIGINT handler with its own (cancel all jobs, raise KeyboardInterrupt), which would turn
    Ctrl-C into a py4j failure mid-read; cdc2ch's handler (stop after the current batch) stays in charge.
    The caller waits for it, or for `stop`: a stop while the JVM starts (seconds, more on a busy machine)
    ends the JVM being started and raises Stopped rather than wait for a session nothing will use.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if _started is not None and SparkContext._active_spark_context is _started.sparkContext:
        return _started  # built on the helper thread: not the active session of this one
    outcome: dict = {}
    global _given_up
    _given_up = False

    def build() -> None:
        try:
            outcome["spark"] = _build(settings or SparkSettings())
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    helper = threading.Thread(target=build, name="cdc2ch-spark-start", daemon=True)
    helper.start()
    while helper.is_alive() and not (stop is not None and stop.is_set()):
        helper.join(STOP_SEEN)
    if helper.is_alive():
        _abandon(helper)
        raise Stopped("Spark's start")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["spark"]


def _abandon(helper: threading.Thread) -> None:
    """A start given up: its JVM (and the scripts still launching it) ended, and its thread left to fail on
    that. The process's gateway is forgotten, so that nothing talks to the JVM gone."""
    from pyspark import SparkContext

    global _given_up
    with _launch_lock:
        _given_up, launched = True, _launched
    if launched is not None:
        kill_tree(launched.pid)
    helper.join(ABANDONED_WAIT)
    with SparkContext._lock:
        gateway = SparkContext._gateway
        if gateway is not None and getattr(gateway, "proc", None) is launched:
            SparkContext._gateway = SparkContext._jvm = None


def _build(settings: SparkSettings):
    global _started
    from pyspark.sql import SparkSession

    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit already set master and jars
    master = settings.master or (None if under_submit else "local[*]")
    local = bool(master and master.startswith("local"))  # driver and executor are this one JVM
    conf = dict(DELTA_CONF)
    if local:
        conf.update(LOCAL_CONF)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # one machine: no hostname guessing
        # Python workers (mapInArrow) must run this interpreter, which has pyarrow; not whatever python3
        # comes first on PATH. On a cluster, set PYSPARK_PYTHON to the executors' environment.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        log4j = Path(__file__).with_name("log4j2.properties")
        # One JVM is driver and executor here: the serial collector keeps its footprint near the heap size
        # (G1 added ~350 MiB at the same heap in the 10x benchmark), and tight free-heap ratios keep the heap
        # near its live data instead of growing to the maximum (-300 MiB on W1 at 10x, same speed). Higher
        # compile thresholds leave the JIT only the truly hot code: it took half the JVM's CPU of a short
        # run on two cores, a third less with them. A metaspace threshold above what Spark and Delta load
        # spares the full collections that loading their classes triggered. A local JVM already exits when
        # a task runs out of memory; one of the driver's own threads (the one taking task results) would
        # only die, and leave its job waiting for ever: the JVM exits then too, and the read fails.
        conf["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j.configurationFile=file:{log4j} -XX:+UseSerialGC -XX:MinHeapFreeRatio=10 "
            "-XX:MaxHeapFreeRatio=30 -XX:CompileThresholdScaling=3 -XX:MetaspaceSize=160m "
            "-XX:+ExitOnOutOfMemoryError"
        )
    user = dict(settings.conf)
    if local:
        memory = user.get("spark.driver.memory", conf["spark.driver.memory"])
        conf["spark.driver.extraJavaOptions"] += young_generation(memory)
    ours = not under_submit and "spark.jars.packages" not in user and "spark.jars" not in user
    if ours:
        found = connectors_in_use(settings.connectors | connectors_for([], user))
        conf.update(jar_conf(delta_jars(), connector_jars(found), local, user))
        conf.update(connector_conf(found))
    conf.update(S3Settings.of(user, os.environ).hadoop_conf(user, provider_chain=ours))
    archive = _class_archive(conf, user)
    if archive is not None:
        conf["spark.driver.extraJavaOptions"] += " " + classarchive.java_options(archive)
    conf.update(user)
    if not under_submit:
        _launch_jvm(conf, master, local)
    builder = SparkSession.builder.appName("cdc2ch")
    if master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("CDC2CH_SPARK_LOG_LEVEL", "ERROR"))
    if local and "spark.sql.files.minPartitionNum" not in user:
        # Twice as many file splits as cores: the JVM holds each task's Arrow result, copied, until it is
        # sent to Python, so smaller tasks halve what a read keeps in memory (-80 MiB peak on W1 at 10x).
        # Large reads are split by maxPartitionBytes as before.
        spark.conf.set("spark.sql.files.minPartitionNum", str(2 * spark.sparkContext.defaultParallelism))
    _started = spark
    if archive is not None and not archive.exists():
        from cdc2ch.base.log import get_logger

        classarchive.save_at_exit(spark, archive, get_logger("cdc2ch.spark"))
    return spark


def delta_conf() -> dict[str, str]:
    """The settings with which a Spark session of one's own (spark-submit, pyspark, a notebook) reads and
    writes Delta tables as cdc2ch's does: the Delta jars of the cache (fetched on first use) and Delta's SQL
    extension and catalog."""
    return {"spark.jars": ",".join(delta_jars()), **{key: DELTA_CONF[key] for key in DELTA_SQL}}


def jar_conf(delta: list[str], connectors: list[str], local: bool, user: dict[str, str]) -> dict[str, str]:
    """Where the jars go: Delta's in spark.jars; the storage connectors' on a local JVM's class path from its
    start (one JVM is driver and executor), unless the user set that class path. Through spark.jars the
    executor would copy each jar through the file server at every start (the AWS SDK's is hundreds of MB)."""
    on_class_path = bool(local and connectors and "spark.driver.extraClassPath" not in user)
    out = {"spark.jars": ",".join(delta + ([] if on_class_path else connectors))}
    if on_class_path:
        out["spark.driver.extraClassPath"] = os.pathsep.join(connectors)
    return out


def young_generation(memory: str) -> str:
    """Young-generation options for a driver heap of `memory` (Spark's size string; MiB without a unit).

    A scan's task results (Arrow batches, tens of MB each, alive until sent to Python) outlived the default
    young generation's collections and its small survivor spaces: promoted, they filled the old generation,
    collected whole every ~2 s of W5's read. A fifth of the heap, with survivor spaces a fifth of that, lets
    them die young (W5 13.5 to 12.1 s, same peak RSS on W1 at 10x: bench/results.md)."""
    found = re.fullmatch(r"(\d+)([kmgt]?)b?", memory.strip().lower())
    if found is None:
        return ""  # a size Spark reads but this does not: the JVM's own sizing
    mib = int(found[1]) * {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024**2}[found[2]]
    return f" -Xmn{int(mib) // 5}m -XX:SurvivorRatio=3" if mib >= 160 else ""


def class_archive(jars: list[str], class_path: list[str] | None = None) -> Path | None:
    """Where a local JVM on cdc2ch's own options and classpath `jars` keeps its class data sharing archive
    (see classarchive.py); None when it is turned off or the cache directory cannot be written."""
    if not classarchive.enabled():
        return None
    try:
        directory = jars_dir()
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only cache: start as before
        return None
    return classarchive.archive_path(directory, jars, class_path)


def _class_archive(conf: dict[str, str], user: dict[str, str]) -> Path | None:
    """The class archive of this session's JVM; None when the user chose its jars or JVM options."""
    ours = "spark.driver.extraJavaOptions" in conf and "spark.jars" in conf
    chosen = {
        "spark.driver.extraJavaOptions",
        "spark.driver.extraClassPath",
        "spark.jars",
        "spark.jars.packages",
    }
    if not ours or chosen & user.keys():
        return None
    class_path = [j for j in conf.get("spark.driver.extraClassPath", "").split(os.pathsep) if j]
    return class_archive(conf["spark.jars"].split(","), class_path)


def _launch_jvm(conf: dict[str, str], master: str | None, local: bool) -> None:
    """Start the JVM as PySpark would (same spark-submit command and settings), but with its stdout and
    stderr read by cdc2ch: each line goes on as a log line (JSON with --log-format json), so what the JVM
    prints before its logging is set up (`WARNING: Using incubator modules`, ...) cannot break JSON logs."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        # spark-submit gets its settings as --conf arguments, which `ps` shows to every user: secrets (a
        # catalog token, a storage key) reach the JVM through the session builder instead (see _build).
        shown = [(k, v) for k, v in conf.items() if not is_secret_key(k)]
        spark_conf = SparkConf().setAll(shown).setAppName("cdc2ch")
        if master:
            spark_conf.setMaster(master)
        # For a local JVM only (not this process, nor what it starts later: the embedded ClickHouse in a child
        # slowed down with it): a fixed trim threshold turns off glibc's sliding mmap threshold, so the large
        # off-heap buffers of Arrow and Parquet are unmapped when freed instead of staying in malloc arenas
        # (-80 MiB peak on W1 at 10x). launch_gateway copies os.environ, so it is there for the call only.
        added = {"MALLOC_TRIM_THRESHOLD_": "131072"} if local else {}
        added = {k: v for k, v in added.items() if k not in os.environ}
        os.environ.update(added)
        try:
            with _watched_launch():
                gateway = launch_gateway(spark_conf, {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT})
        finally:
            for key in added:
                os.environ.pop(key, None)
        SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm
    threading.Thread(
        target=_relay, args=(gateway.proc.stdout,), name="cdc2ch-jvm-output", daemon=True
    ).start()


@contextmanager
def _watched_launch():
    """While launch_gateway runs: the process it starts recorded in `_launched` as soon as it exists (PySpark
    hands it over only once the JVM answers), so that a start given up can end it; one given up before the
    launch began ends it at once."""
    from pyspark import java_gateway

    global _launched

    class Watched(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            global _launched
            super().__init__(*args, **kwargs)
            with _launch_lock:
                _launched, given_up = self, _given_up
            if given_up:
                kill_tree(self.pid)

    _launched = None
    java_gateway.Popen = Watched  # type: ignore[misc]  # launch_gateway's own name for it
    try:
        yield
    finally:
        java_gateway.Popen = subprocess.Popen  # type: ignore[misc]


def lazy_session(
    settings: SparkSettings | None = None, on_start=None, stop: threading.Event | None = None
) -> LazySpark:
    """The process's session, started by the first caller that needs it (see lazysession.py); a `stop`
    while it starts gives the start up (Stopped)."""
    return LazySpark(start, settings, on_start, stop)


def start(settings: SparkSettings, what: str, stop: threading.Event | None = None):
    """Start Spark, or say in one paragraph (`what` needed it) that Java is missing and what works without."""
    from pyspark import SparkContext

    java = java_binary()
    running = "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None  # a JVM is there
    if java is None and not running:
        home = os.environ.get("JAVA_HOME")
        raise no_java(
            what,
            f"JAVA_HOME is {home}, which has no bin/java"
            if home
            else "JAVA_HOME is not set and no `java` is on PATH",
        )
    try:
        return session(settings, stop)
    except Exception as exc:
        if "JAVA_GATEWAY_EXITED" not in str(exc) and "Java gateway process exited" not in str(exc):
            raise
        raise no_java(what, f"{java} did not start a JVM (see the lines above)") from None


def java_binary() -> str | None:
    """The java PySpark starts: $JAVA_HOME/bin/java when JAVA_HOME is set, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java")


def jvm_pid(spark) -> int | None:
    """The pid of the JVM this process started for `spark` (None for one it did not start: spark-submit)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    return getattr(proc, "pid", None)


def _relay(stream) -> None:
    """Pass on the JVM's output line by line until it exits (never stop reading: a full pipe blocks it)."""
    from cdc2ch.base.log import relay

    level = None
    for raw in iter(stream.readline, b""):
        try:
            level = relay("spark", raw.decode("utf-8", "replace").rstrip("\r\n"), level)
        except Exception:  # a line that cannot be shown must not stop the JVM
            pass


def positional_columns(df: DataFrame) -> tuple[DataFrame, list[str]]:
    """`mapInArrow` resolves columns by name and trips over dots in them: the frame with positional names
    (_c0, _c1, ...) and the real names, to restore on the Arrow side."""
    names = df.columns
    return df.toDF(*[f"_c{i}" for i in range(len(names))]), names


def _param_spec_reduce(spec):
    """A typing.ParamSpec (in a library's annotations) of a module shipped by value: rebuilt by name, where
    pickle would import the module it came from; any other, by reference as pickle does."""
    from pyspark import cloudpickle

    shipped = cloudpickle.list_registry_pickle_by_value()
    if any(spec.__module__ == m or spec.__module__.startswith(m + ".") for m in shipped):
        return typing.ParamSpec, (spec.__name__,)
    return spec.__name__


@contextmanager
def shipped_by_value(*modules):
    """While the block builds and runs Spark tasks, let them call functions of these (self-contained) modules
    on executors where cdc2ch is not installed: cloudpickle sends their code instead of a reference to
    import; with each, the modules it names in SHIPS_WITH (libraries the executors may lack). Afterwards the
    process's pickler is as it was (the session may be the caller's)."""
    from pyspark import cloudpickle

    table = cloudpickle.Pickler._dispatch_table
    table.setdefault(typing.ParamSpec, _param_spec_reduce)  # type: ignore[arg-type]  # typed by its first keys; any type goes
    shipped = [s for m in modules for s in (m, *getattr(m, "SHIPS_WITH", ()))]
    wanted = {m.__name__: m for m in shipped}
    added = [m for name, m in wanted.items() if name not in cloudpickle.list_registry_pickle_by_value()]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)


def prepare(connectors: list[str]) -> None:
    """Ahead of the first run (`make demo`, `make install`): fetch the Delta jars (and the storage `connectors` named),
    then run cdc2ch's own CDF and snapshot reads once on a throwaway table so that this process leaves the
    class archive behind (see classarchive.py)."""
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    for jar in delta_jars() + connector_jars(connectors_in_use(frozenset(connectors))):
        print(jar)
    spark = session()
    with tempfile.TemporaryDirectory(prefix="cdc2ch-warm-") as tmp:
        spark.range(100).selectExpr("id", "CAST(id AS STRING) AS name").write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(tmp)
        spark.sql(f"UPDATE delta.`{tmp}` SET name = 'x' WHERE id < 10")
        spark.sql(f"DELETE FROM delta.`{tmp}` WHERE id < 5")
        source = DeltaSource(spark, tmp)
        latest = source.latest_version()
        source.changes(0, latest).arrow_rows(immutable_keys=False)
        source.snapshot(latest).toArrow()


if __name__ == "__main__":
    prepare(sys.argv[1:])
