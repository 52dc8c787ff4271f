"""Messages as the user reads them: whole, or deliberately summarised (first sentence, or whole words and an
ellipsis), never cut inside a word; the whole text stays in `cdc2ch status --json` (issue 17, item 3)."""

from __future__ import annotations

import json
import re

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from cdc2ch.base.errors import (
    CHANGE_FEED,
    ELLIPSIS,
    JVM_STOPPED,
    SchemaChangeError,
    SourceError,
    error_text,
    jvm_stopped,
    out_of_memory,
    summarise,
)
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.commands.app import failure_summary
from cdc2ch.commands.status import ERROR_CHARS_IN_TABLE, render_table
from cdc2ch.fleet.runner import Slot
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.metrics import Metrics
from tests.unit.clickhouse.test_clickhouse_side import FakeClient

pytestmark = pytest.mark.unit

WORDS = re.compile(r"[\w/.'`()-]+")

# The message a schema break raises (pipeline.Replicator._schema_broken), as users met it in the summary.
SCHEMA_BREAK = str(
    SchemaChangeError(
        'The Delta schema changed at version 3 of /data/lake/sales/orders (DROP COLUMNS ["name"]): column '
        "'name' was dropped. ClickHouse table analytics.orders cannot follow this in place, so replication "
        "stopped with version 2 committed. Run again with --on-schema-change resync to rebuild "
        "analytics.orders from a snapshot of the new schema (readers keep the old table until the new one is "
        "swapped in), or replicate into a new --target."
    )
)


def assert_whole_words(short: str, full: str) -> None:
    """Every word of `short` is a word of `full`: nothing was cut inside a word."""
    full_words = set(WORDS.findall(full))
    for word in WORDS.findall(short.rstrip(ELLIPSIS)):
        assert word in full_words, f"{word!r} is a cut word in {short!r}"


def test_a_message_that_fits_is_kept_whole():
    assert summarise("Short.\n  Two lines.", 100) == "Short. Two lines."


def test_a_long_message_is_summarised_to_its_first_sentence():
    short = summarise(SCHEMA_BREAK, 300)
    assert short == (
        'The Delta schema changed at version 3 of /data/lake/sales/orders (DROP COLUMNS ["name"]): column '
        "'name' was dropped."
    )


def test_a_message_without_a_short_first_sentence_ends_at_a_word_with_an_ellipsis():
    text = "Error executing HTTP request attempt 5 (http://clickhouse:8123) " + "connection refused " * 30
    short = summarise(text, 120)
    assert len(short) <= 120 and short.endswith(ELLIPSIS)
    assert_whole_words(short, text)
    # ClickHouse's "Code: 62." opens its messages: it is no sentence of its own.
    code = "Code: 62. DB::Exception: Syntax error: failed at position 8 (FORMAT): " + "FORMAT x " * 40
    assert summarise(code, 100).startswith("Code: 62. DB::Exception: Syntax error")


def test_the_config_once_summary_names_each_failure_by_its_first_sentence():
    cfg = RunConfig(
        "/data/lake/sales/orders", ("id",), TargetName("analytics", "orders"), "chdb:///x", "orders"
    )
    slot = Slot(cfg, Metrics().pipeline("orders"), None)
    from cdc2ch.model.records import Health

    slot.health = Health("orders", cfg.table, str(cfg.target)).failed(None, SCHEMA_BREAK, "schema_change")
    text = failure_summary([slot], 3)
    # Today: "... so replication stopped with . `cdc2ch status` ..." (cut at 300 characters mid-sentence).
    assert " . " not in text and "with ." not in text
    assert "orders (schema_change): The Delta schema changed at version 3" in text
    assert "column 'name' was dropped. `cdc2ch status` shows each pipeline's whole last error" in text
    assert_whole_words(text, SCHEMA_BREAK + " 1 of 3 pipelines failed, the others replicated: orders "
                       "(schema_change): `cdc2ch status` shows each pipeline's whole last error; fix the "
                       "cause and run again.")  # fmt: skip


def test_clickhouse_messages_are_summarised_at_a_word():
    detail = "Code: 60. DB::Exception: Unknown table expression identifier " + "'analytics.orders_x' " * 40
    client = FakeClient(DatabaseError(detail, code=60))
    with pytest.raises(Exception) as err:
        Sink(client, "http://u@h:8123/db", 1).row_count("`d`.`t`")
    summary, advice = str(err.value).split(ELLIPSIS)
    assert summary.endswith(" 'analytics.orders_x'")  # ends at a whole word (today: "'analytics.o...")
    assert advice.startswith(". Nothing after the last committed version")  # then our own advice


def test_the_status_table_shows_an_error_summarised_at_a_word():
    row = {
        "pipeline": "orders",
        "target": "analytics.orders",
        "committed_version": 2,
        "latest_version": 3,
        "versions_behind": 1,
        "seconds_behind": 4.0,
        "rows_written": 10,
        "last_success": None,
        "error": "ClickHouse at http://u@h:8123/db failed to insert into `analytics`.`orders`: "
        + "x yz " * 60,
    }
    cell = render_table([row]).splitlines()[1].split("  ")[-1].strip()
    assert len(cell) <= ERROR_CHARS_IN_TABLE and cell.endswith(ELLIPSIS)
    assert_whole_words(cell, row["error"])


def test_the_final_error_line_is_json_under_log_format_json():
    from cdc2ch.base import log

    message = 'Table "x" — refused.\nRun `cdc2ch snapshot`.'
    try:
        log.configure("json")
        event = json.loads(log.final(message, 2))
        assert event["event"] == "error" and event["message"] == message and event["exit_code"] == 2
        assert json.loads(log.final("stopping", 130, kind="interrupted"))["event"] == "interrupted"
        log.configure("console")
        assert log.final(message, 2) == f"cdc2ch: error: {message}"
    finally:
        log.configure("console")


PY4J_CLIENT = "/venv/site-packages/py4j/clientserver.py"


def _refused_at(where: str) -> ConnectionRefusedError:
    """A refused connection as if raised by the code of the file `where`."""
    try:
        exec(compile("raise ConnectionRefusedError(111, 'Connection refused')", where, "exec"))
    except ConnectionRefusedError as exc:
        return exc


def test_an_error_from_a_jvm_that_is_gone_is_told_as_such():
    """A local JVM exits on OutOfMemoryError. A call under way then fails on its connection (py4j's
    'Error while sending or receiving'), and an error it already returned cannot be turned into text: both
    read as JVM_STOPPED, which the snapshot's out-of-memory paragraph recognises. So does the bare error py4j
    makes up when the connection is reset mid-call, and the job cancelled by the exiting JVM's shutdown hook."""
    from py4j.protocol import ERROR, STRING_TYPE, Py4JError, Py4JNetworkError, get_return_value

    class Unreadable(Exception):
        def __str__(self):
            raise ConnectionRefusedError("the JVM is gone")

    assert error_text(Py4JNetworkError("Error while sending or receiving")) == JVM_STOPPED
    assert error_text(Unreadable()) == JVM_STOPPED

    def answered(answer: str) -> Exception:  # what py4j raises for an answer, by its own rule
        try:
            get_return_value(answer, None, "z:org.apache.spark.api.python.PythonRDD", "runJob")
        except Exception as exc:
            return exc

    # A connection reset while the JVM worked on the call: py4j answers itself with a bare error.
    assert error_text(answered(ERROR)) == JVM_STOPPED
    # An error the JVM sent back keeps its text.
    sent = answered(ERROR + STRING_TYPE + "java.lang.IllegalStateException: no such job")
    assert "no such job" in error_text(sent)
    assert error_text(Py4JError("An error occurred while calling o12.count. Trace:\nboom\n")) != JVM_STOPPED
    assert error_text(Py4JError("o12.nothing does not exist in the JVM")) != JVM_STOPPED
    # py4j's own names cannot be missing from a working gateway: a JVM out of memory answers so, for
    # whichever name PySpark looked up (seen: the top package, the package and the class)
    for name in (
        "py4j",
        "py4j.reflection",
        "py4j.reflection.TypeUtil",
        "py4j.reflection.TypeUtil.isInstanceOf",
    ):
        assert error_text(Py4JError(f"{name} does not exist in the JVM")) == JVM_STOPPED
    assert error_text(Py4JError("org.example.Nothing does not exist in the JVM")) != JVM_STOPPED
    assert error_text(Py4JError("py4jx does not exist in the JVM")) != JVM_STOPPED
    assert error_text(Py4JError("py4j.reflection does not exist in the JVM, and more")) != JVM_STOPPED

    # the next call cannot reach the gateway
    assert error_text(_refused_at(PY4J_CLIENT)) == JVM_STOPPED
    assert (
        error_text(_refused_at("/venv/site-packages/urllib3/connection.py"))
        == "[Errno 111] Connection refused"
    )
    assert error_text(ValueError("plain")) == "plain"

    # An exiting JVM's shutdown hook stops the context, which may cancel the job before the job's own
    # failure (OutOfMemoryError) reaches it; the JVM is still there to say so (text as Spark 4.1 gave it).
    cancelled = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.runJob.\n: "
        "org.apache.spark.SparkException: Job 4 cancelled because SparkContext was shut down\n\tat "
        "org.apache.spark.scheduler.DAGScheduler.$anonfun$cleanUpAfterSchedulerStop$1(DAGScheduler.scala:1309)"
    )
    assert error_text(RuntimeError(cancelled)) == JVM_STOPPED
    assert error_text(RuntimeError(cancelled.replace("SparkContext", "a user"))) != JVM_STOPPED


def test_a_jvm_gone_outside_a_translated_call_gets_a_paragraph_and_the_block_error_stays():
    """Starting the session or putting a setting back is not translated: when the JVM is gone there, the
    command still ends with one paragraph (cli, runner), and a setting that cannot be put back does not hide
    the error of the block that set it."""
    from cdc2ch.source.spark import sessionconf
    from cdc2ch.source.spark.sessionconf import session_conf

    stopped = jvm_stopped(_refused_at(PY4J_CLIENT))
    assert isinstance(stopped, SourceError) and "spark.driver.memory" in str(stopped)
    assert "resumes where this one stopped" in str(stopped)
    assert jvm_stopped(ValueError("plain")) is None
    assert jvm_stopped(SourceError(JVM_STOPPED)) is None  # already a paragraph

    class Conf:  # a session whose JVM goes away inside the block
        values: dict = {}
        gone = False

        def get(self, key, default=None):
            return self.values.get(key, default)

        def set(self, key, value):
            if self.gone:
                raise _refused_at(PY4J_CLIENT)
            self.values[key] = value

        def unset(self, key):
            if self.gone:
                raise _refused_at(PY4J_CLIENT)
            self.values.pop(key, None)

    class Session:
        conf = Conf()

    spark = Session()
    with pytest.raises(KeyError, match="the block's own"):
        with session_conf(spark, {"a": "1", "b": "2"}):
            spark.conf.gone = True
            raise KeyError("the block's own")
    spark.conf.gone = False
    with pytest.raises(ConnectionRefusedError):  # with nothing else to show, the failure to put back shows
        with session_conf(spark, {"a": "1"}):
            spark.conf.gone = True
    assert not [key for key in sessionconf._CONF_HELD if key[0] == id(spark)]  # every key counted down


def test_library_records_are_log_lines_and_py4j_tracebacks_stay_out(capsys):
    """py4j logs a connection it lost to the root logger with a traceback; libraries' records become
    cdc2ch's log lines (JSON here), an exception as one line, and py4j's show at debug level only, as do
    those of the ClickHouse transport (urllib3, clickhouse-connect), whose failures cdc2ch tells itself."""
    import logging
    import os
    import sys

    from cdc2ch.base import log

    def record(name: str, level: int, path: str) -> logging.LogRecord:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            info = sys.exc_info()
        return logging.LogRecord(name, level, path, 1, "Exception while sending command.", None, info)

    py4j = os.path.join("venv", "py4j", "java_gateway.py")
    other = os.path.join("venv", "delta_sharing", "rest_client.py")
    transport = os.path.join("venv", "urllib3", "connectionpool.py")
    try:
        for level in ("info", "debug"):
            log.configure("json", level)
            capsys.readouterr()
            logging.getLogger().handle(record("root", logging.ERROR, py4j))
            logging.getLogger().handle(record("urllib3.connectionpool", logging.WARNING, transport))
            logging.getLogger().handle(record("clickhouse_connect.driver", logging.ERROR, transport))
            logging.getLogger().handle(record("delta_sharing", logging.WARNING, other))
            logging.getLogger().handle(record("cdc2ch.pipeline", logging.ERROR, other))  # the API's own
            err = capsys.readouterr().err
            assert "Traceback" not in err
            events = [json.loads(line) for line in err.splitlines()]
            hidden = [
                ("root", "debug"),
                ("urllib3.connectionpool", "debug"),
                ("clickhouse_connect.driver", "debug"),
            ]
            assert [(e["logger"], e["level"]) for e in events] == ([] if level == "info" else hidden) + [
                ("delta_sharing", "warning")
            ]
            assert events[-1]["error"] == "ConnectionResetError: [Errno 104] Connection reset by peer"
    finally:
        with capsys.disabled():  # not onto capsys's stream, which closes with this test
            log.configure("console")


def test_spark_out_of_memory_is_recognised_in_each_form_and_a_range_read_says_what_to_change():
    from cdc2ch.source.sharing.sharedsource import advice

    heap = "java.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.util.Arrays.copyOf"
    arrow = "org.apache.arrow.memory.OutOfMemoryException: Failure allocating buffer."
    assert all(out_of_memory(t) for t in (heap, arrow, JVM_STOPPED))
    assert not out_of_memory("java.io.FileNotFoundException: part-0001.parquet")

    class Client:  # the one call advice() makes of a sharing client
        def redact(self, text):
            return text

    found = advice("share#s.t", Client(), RuntimeError(arrow), CHANGE_FEED, 3, 5)
    assert str(found).startswith("Spark ran out of memory reading the change data feed for versions 3..5 of")
    assert "--max-rows-per-read" in str(found) and "spark.driver.memory" in str(found)
    other = advice("share#s.t", Client(), RuntimeError(arrow), "the metadata", None, None)
    assert str(other).startswith("Reading the metadata for the latest version of share#s.t failed")
