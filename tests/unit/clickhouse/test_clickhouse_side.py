"""The ClickHouse side without ClickHouse: error codes, the transport's retries and messages, DSNs, DDL,
the embedded engine's lock, and the import graph. Stand-ins for the clickhouse-connect client raise the real
clickhouse-connect exception classes, with codes as the driver sets them."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    OperationalError,
    ProgrammingError,
    StreamFailureError,
)
from structlog.testing import capture_logs

from cdc2ch.base.errors import ConfigError, LockedError, SinkError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import dsn, embedded
from cdc2ch.clickhouse.connection import remote as server
from cdc2ch.clickhouse.connection.owntables import OwnTables
from cdc2ch.clickhouse.connection.placement import Cluster, OneServer
from cdc2ch.clickhouse.connection.transport import Sink, TargetTraits
from cdc2ch.clickhouse.tables import ddl
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.replication.metrics import error_kind

pytestmark = pytest.mark.unit

PASSWORD = "pa55-w0rd"


def db_error(code: int, name: str = "X", cls=DatabaseError):
    return cls(f"Code: {code}. DB::Exception: something. ({name})", code=code, name=name)


# -- codes ---------------------------------------------------------------------------------------------
def test_codes_are_clickhouses():
    assert codes.AUTHENTICATION_FAILED == 516
    assert codes.CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN == 349
    assert codes.SOCKET_TIMEOUT == 209 and codes.TABLE_IS_READ_ONLY == 242
    assert codes.TRANSIENT == {3, 159, 202, 209, 210, 236, 242, 252, 319, 394, 425, 999}
    assert codes.AUTHENTICATION_FAILED in codes.CREDENTIALS_REJECTED
    assert not codes.TRANSIENT & codes.CREDENTIALS_REJECTED


def test_error_code_is_read_from_the_exception_not_its_text():
    assert codes.error_code(DatabaseError("Authentication failed", code=516)) == 516
    assert codes.error_code(OperationalError("Error executing HTTP request")) is None
    # Digits in the text (a port, a query id, a quoted "Code: N") are not a code.
    assert codes.error_code(DatabaseError("Code: 516. connecting to host:5160")) is None
    assert codes.error_code(ValueError("Code: 242")) is None
    assert codes.error_code(None) is None


def test_error_code_follows_cause_and_context():
    try:
        try:
            raise db_error(242, "TABLE_IS_READ_ONLY")
        except DatabaseError as exc:
            raise RuntimeError("while inserting") from exc
    except RuntimeError as exc:
        caused = exc
    assert codes.error_code(caused) == 242 and codes.is_transient(caused)
    try:
        try:
            raise db_error(62, "SYNTAX_ERROR")
        except DatabaseError:
            raise KeyError("during handling")  # noqa: B904 - the implicit __context__ is the point
    except KeyError as exc:
        context = exc
    assert codes.error_code(context) == 62 and not codes.is_transient(context)
    assert codes.clickhouse_error(context).name == "SYNTAX_ERROR"
    # A chain that loops back on itself ends.
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert codes.error_code(a) is None and codes.clickhouse_error(a) is None


def test_sink_error_carries_the_code_and_keeps_it_when_pickled():
    exc = SinkError("ClickHouse at x failed", code=242)
    assert codes.error_code(exc) == 242
    back = pickle.loads(pickle.dumps(exc))
    assert back.code == 242 and str(back) == "ClickHouse at x failed"
    assert SinkError("no code").code is None


@pytest.mark.parametrize(
    "exc, transient",
    [
        (db_error(242, "TABLE_IS_READ_ONLY"), True),
        (db_error(209, "SOCKET_TIMEOUT", OperationalError), True),
        (db_error(516, "AUTHENTICATION_FAILED"), False),
        (db_error(62, "SYNTAX_ERROR"), False),
        (db_error(62, "SYNTAX_ERROR", StreamFailureError), False),  # the code decides over the class
        (OperationalError("Error HTTPConnectionPool ... Connection refused"), True),  # no code: transport
        (ProgrammingError("The client has been closed"), False),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (DatabaseError("Code: 242. text only, no code attribute"), False),
    ],
)
def test_is_transient(exc, transient):
    assert codes.is_transient(exc) is transient


def test_error_kind_by_class_and_by_clickhouse_error_in_the_chain():
    assert error_kind(SinkError("x", code=516)) == "clickhouse"
    assert error_kind(LockedError("held")) == "locked"
    assert error_kind(db_error(60, "UNKNOWN_TABLE")) == "clickhouse"
    try:
        raise RuntimeError("wrapped") from db_error(210)
    except RuntimeError as exc:
        assert error_kind(exc) == "clickhouse"
    assert error_kind(ValueError("bug")) == "internal"


# -- the transport -------------------------------------------------------------------------------------
class FakeClient:
    """A clickhouse-connect client stand-in: each call takes the next outcome (an exception is raised)."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls: list[tuple] = []
        self.closed = False

    def _next(self, call: tuple):
        self.calls.append(call)
        out = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def command(self, sql, settings=None):
        return self._next(("command", sql, settings))

    def query(self, sql, parameters=None, settings=None):
        return SimpleNamespace(result_rows=self._next(("query", sql, parameters, settings)))

    def query_arrow(self, sql, settings=None):
        return self._next(("query_arrow", sql, settings))

    def insert_arrow(self, table, data, settings=None):
        return self._next(("insert_arrow", table, data.num_rows, settings))

    def raw_query(self, sql, fmt=None):
        return self._next(("raw_query", sql, fmt))

    def raw_insert(self, table, column_names=None, insert_block=None, settings=None, fmt=None):
        return self._next(("raw_insert", table, insert_block, settings, fmt))

    def close(self):
        self.closed = True


def sink_on(client, retries: int = 4) -> Sink:
    task_client = {"host": "h", "username": "u", "password": PASSWORD}
    return Sink(
        client, "http://u@h:8123/db", retries, wait_base=0.0, traits=TargetTraits(task_client=task_client)
    )


def test_transient_failures_are_retried_then_reported_with_code_and_without_password():
    error = db_error(242, "TABLE_IS_READ_ONLY")
    error.args = (f"{error.args[0]} (for url http://u:{PASSWORD}@h:8123)",)  # a secret echoed back
    client = FakeClient(error)
    with capture_logs() as logs, pytest.raises(SinkError) as err:
        sink_on(client, retries=4).command("INSERT 1", what="write the batch")
    assert len(client.calls) == 4
    assert [e["attempt"] for e in logs if e["event"] == "clickhouse_retry"] == [1, 2, 3]
    message = str(err.value)
    assert err.value.code == 242 and isinstance(err.value.__cause__, DatabaseError)
    assert message.startswith("ClickHouse at http://u@h:8123/db failed to write the batch: Code: 242.")
    assert "could not be reached after 4 attempts" in message and "offset was not moved" in message
    assert PASSWORD not in message and all(PASSWORD not in e["error"] for e in logs)


def test_other_failures_are_tried_once():
    client = FakeClient(db_error(62, "SYNTAX_ERROR"))
    with capture_logs() as logs, pytest.raises(SinkError) as err:
        sink_on(client, retries=4).query_rows("SELEC 1", what="ask")
    assert len(client.calls) == 1 and not logs
    assert err.value.code == 62
    assert "Nothing after the last committed version was recorded" in str(err.value)


@pytest.mark.parametrize("code, says", [(164, "may only read"), (497, "lacks a privilege")])
def test_a_refusal_is_not_retried_and_says_what_to_do(code, says):
    client = FakeClient(db_error(code, "READONLY" if code == 164 else "ACCESS_DENIED"))
    with capture_logs() as logs, pytest.raises(SinkError) as err:
        sink_on(client, retries=4).command("CREATE DATABASE x", what="create the database")
    assert len(client.calls) == 1 and not logs
    assert err.value.code == code and says in str(err.value)
    assert "could not be reached" not in str(err.value)


def test_a_transient_failure_then_success_returns_the_result():
    client = FakeClient(OperationalError("connection reset"), [(1, "a")])
    assert sink_on(client).query_rows("SELECT", {"p": 1}) == [(1, "a")]
    assert client.calls == [("query", "SELECT", {"p": 1}, None)] * 2


def test_a_record_is_one_json_line_and_small_statements_carry_the_small_settings():
    client = FakeClient(None)
    sink = Sink(client, "chdb:///x", traits=TargetTraits(small_settings=embedded.NO_JIT))
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    sink.insert_row("`d`.`t`", {"p": "é", "n": 7, "at": at, "naive": datetime(2026, 1, 2), "none": None})
    _, table, line, settings, fmt = client.calls[-1]
    assert (table, settings, fmt) == ("`d`.`t`", {"insert_deduplicate": 0}, "JSONEachRow")
    assert json.loads(line) == {
        "p": "é", "n": 7, "at": "2026-01-02 01:04:05.678", "naive": "2026-01-02 00:00:00.000", "none": None
    }  # fmt: skip
    sink.query_rows("SELECT 1", settings={"max_threads": 1})
    sink.command("INSERT 1")  # bulk statements keep the engine's defaults
    assert client.calls[-2][3] == {**embedded.NO_JIT, "max_threads": 1} and client.calls[-1][2] is None
    sink_on(client).query_rows("SELECT 1")  # a server's: as they were
    assert client.calls[-1][3] is None


def test_errors_that_are_not_clickhouses_pass_through_untouched():
    client = FakeClient(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        sink_on(client).command("SELECT 1")
    assert len(client.calls) == 1


def test_insert_settings_and_long_messages_are_cut():
    client = FakeClient(None)
    data = pa.table({"id": [1, 2, 3]})
    sink = sink_on(client)
    assert sink.insert_arrow("`d`.`t`", data, token="tok") == 3
    assert sink.insert_arrow("`d`.`t`", data) == 3
    assert [c[3] for c in client.calls] == [
        {"insert_deduplicate": 1, "insert_deduplication_token": "tok", "optimize_on_insert": 0},
        {"insert_deduplicate": 0, "optimize_on_insert": 0},
    ]
    long = FakeClient(DatabaseError("xyz " * 1250, code=60))
    with pytest.raises(SinkError) as err:
        sink_on(long).row_count("`d`.`t`")
    assert "xyz " * 99 + "xyz…" in str(err.value) and "xyz " * 101 not in str(err.value)
    with sink_on(client) as s:
        pass
    assert client.closed and s.clients.count == 0


# -- DSNs ----------------------------------------------------------------------------------------------
def test_redact():
    assert dsn.redact("http://u:secret@h:8123/db") == "http://u:***@h:8123/db"
    assert dsn.redact("https://u@h/db") == "https://u@h/db"
    assert dsn.redact("chdb:///data/clickhouse") == "chdb:///data/clickhouse"
    assert dsn.redact("http://[::1") == "<unparseable DSN>"


@pytest.mark.parametrize(
    "target, error, text",
    [
        ("mysql://u:hunter2@h/db", SinkError, "is not a DSN cdc2ch understands"),
        ("http://u:hunter2@h:8123/db", ConfigError, "contains a password"),
        ("http://u@h:port/db", ConfigError, "has an invalid port"),
        ("http:///db", ConfigError, "names no host"),
        ("http://u@h/db?compress=1", ConfigError, "unknown parameter 'compress'"),
        ("http://u@h/db?connect_timeout=soon", ConfigError, "is not a number of seconds"),
        ("chdb:", SinkError, "The embedded DSN has no path"),
    ],
)
def test_bad_dsns_are_refused_before_connecting(monkeypatch, target, error, text):
    monkeypatch.setattr(server.clickhouse_connect, "get_client", lambda **kw: pytest.fail("connected"))
    with pytest.raises(error, match=text) as err:
        dsn.connect(target)
    assert "hunter2" not in str(err.value)


def test_credentials_are_told_by_code_and_not_retried(monkeypatch):
    calls = []

    def refuse(**kwargs):
        calls.append(kwargs)
        raise db_error(516, "AUTHENTICATION_FAILED")

    monkeypatch.setenv(server.PASSWORD_ENV, PASSWORD)
    monkeypatch.delenv(server.PASSWORD_FILE_ENV, raising=False)
    monkeypatch.setattr(server.clickhouse_connect, "get_client", refuse)
    with pytest.raises(SinkError, match="rejected the credentials for user 'reader'") as err:
        dsn.connect("http://reader@h:8123/db", retries=5)
    assert len(calls) == 1 and calls[0]["password"] == PASSWORD and err.value.code == 516


def test_unreachable_is_retried_and_not_taken_for_bad_credentials(monkeypatch):
    calls = []

    def unreachable(**kwargs):
        calls.append(kwargs)
        raise OperationalError(f"Error connecting to h:5160 with {PASSWORD} (Code: 516)")

    monkeypatch.setenv(server.PASSWORD_ENV, PASSWORD)
    monkeypatch.setattr(server.clickhouse_connect, "get_client", unreachable)
    with pytest.raises(SinkError) as err:
        dsn.connect("http://u@h:5160/", retries=2)
    assert len(calls) == 2 and err.value.code is None
    assert "Cannot connect to ClickHouse at http://u@h:5160/ (2 attempts)" in str(err.value)
    assert PASSWORD not in str(err.value)


# -- the embedded engine's lock ---------------------------------------------------------------------------
def test_embedded_in_use_is_told_by_the_engines_file_lock(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    path.mkdir()
    (path / embedded.HOLDER_FILE).write_text(
        json.dumps({"pid": 42, "host": "box", "command": "cdc2ch run", "since": "2026-01-01 00:00:00 UTC"})
    )
    refused = ProgrammingError("Unable to open the chdb engine: Code: 36. DB::Exception: Error initializing")
    monkeypatch.setattr(
        embedded.clickhouse_connect, "get_client", lambda **kw: (_ for _ in ()).throw(refused)
    )
    # Nobody holds the directory: the failure is reported as it is.
    with pytest.raises(SinkError, match=f"Cannot open the embedded ClickHouse at {path}"):
        dsn.connect(f"chdb://{path}")
    fd = os.open(path / embedded.STATUS_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the engine of another process does
        assert embedded._held_by_another_process(path)
        with pytest.raises(LockedError) as err:  # "in use": exit code 75, as for a claimed pipeline
            dsn.connect(f"chdb://{path}")
        assert (
            f"The embedded ClickHouse database at {path} is in use by cdc2ch run (pid 42 on host box"
            in str(err.value)
        )
        assert err.value.exit_code == 75 and error_kind(err.value) == "locked"
    finally:
        os.close(fd)
    assert not embedded._held_by_another_process(path)
    assert not embedded._held_by_another_process(tmp_path / "nothing-here")


def test_embedded_engine_already_open_elsewhere(tmp_path, monkeypatch):
    refused = ProgrammingError(
        "Unable to open the chdb engine at '/b': Failed to create connection: Code: 36. DB::Exception: "
        "EmbeddedServer already initialized with path '/a', cannot connect with different path '/b'. "
        "(BAD_ARGUMENTS)"
    )
    monkeypatch.setattr(
        embedded.clickhouse_connect, "get_client", lambda **kw: (_ for _ in ()).throw(refused)
    )
    with pytest.raises(SinkError, match="already has an embedded ClickHouse open at another path"):
        dsn.connect(f"chdb://{tmp_path / 'b'}")


# -- DDL ------------------------------------------------------------------------------------------------
class CatalogSink:
    """Just what ddl uses of a Sink: a table's columns, and the statements it was sent."""

    def __init__(self, columns, refuse: str | None = None, placement=None):
        self.columns, self.refuse = columns, refuse
        self.placement = placement or OneServer()
        self.own = OwnTables(self.query_rows)
        self.statements: list[str] = []

    def table_columns(self, target):
        return self.columns

    def query_rows(self, sql, parameters=None, what="", settings=None):
        return []  # no database, no table: a new target

    def ensure_database(self, database):
        self.statements.append(f"CREATE DATABASE {database}")

    def command(self, sql, what="", settings=None):
        if self.refuse and self.refuse in sql:
            raise SinkError(f"ClickHouse refused to {what}", 36)
        self.statements.append(" ".join(sql.split()))


def test_a_target_clickhouse_refuses_to_create_leaves_no_database():
    sink = CatalogSink(None, refuse="CODEC")
    design = TableDesign(("id",), codecs=(("name", "NoSuchCodec"),))
    with pytest.raises(SinkError, match="refused to create the target table"):
        ddl.prepare_target(sink, TARGET, {"id": "Int64", "name": "Nullable(String)"}, design)
    assert sink.statements == ["CREATE DATABASE db", "DROP DATABASE IF EXISTS `db`"]


TARGET = TargetName("db", "t")
META = {"_commit_version": "UInt64", "_commit_timestamp": "DateTime64(3, 'UTC')", "_version": "UInt64"}


def test_prepare_target_creates_a_missing_table():
    sink = CatalogSink(None)
    change = ddl.prepare_target(
        sink, TARGET, {"id": "Int64", "name": "Nullable(String)"}, TableDesign(("id",)), "hi"
    )
    assert change.empty
    assert sink.statements == [
        "CREATE DATABASE db",
        " ".join(
            schema.target_table_ddl(
                TARGET, {"id": "Int64", "name": "Nullable(String)"}, TableDesign(("id",)), "hi"
            ).split()
        ),
    ]


def test_prepare_target_adds_and_widens_columns_in_place():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META})
    change = ddl.prepare_target(
        sink, TARGET, {"id": "Int64", "n": "Int64", "s": "Nullable(String)"}, TableDesign(("id",))
    )
    assert change.added == {"s": "Nullable(String)"} and change.modified == {"n": ("Int32", "Int64")}
    assert sink.statements == [
        f"ALTER TABLE {schema.qualified(TARGET)} ADD COLUMN IF NOT EXISTS `s` Nullable(String) AFTER `n`",
        f"ALTER TABLE {schema.qualified(TARGET)} MODIFY COLUMN `n` Int64",
    ]


def test_prepare_target_leaves_the_table_alone_on_a_breaking_change():
    sink = CatalogSink({"id": "Int64", "gone": "String", **META})
    change = ddl.prepare_target(sink, TARGET, {"id": "Int64", "s": "String"}, TableDesign(("id",)))
    assert change.breaking and sink.statements == []


VIEW = (
    "CREATE OR REPLACE VIEW `db`.`t_current` AS SELECT `id`, `n` FROM `db`.`t` FINAL WHERE _is_deleted = 0 "
    "SETTINGS do_not_merge_across_partitions_select_final = 1"
)


def test_the_view_is_replaced_once_per_process_then_only_with_the_tables_columns():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META})
    tables = ddl.ClickHouseTables(sink, TARGET, TableDesign(("id",)))
    tables.prepare({"id": "Int64", "n": "Int32"})
    tables.prepare({"id": "Int64", "n": "Int32"})
    assert sink.statements == [VIEW]  # an unchanged table: the view once, not at every range
    tables.prepare({"id": "Int64", "n": "Int64"})
    assert sink.statements[1].endswith("MODIFY COLUMN `n` Int64") and sink.statements[2:] == [VIEW]
    tables.prepare({"id": "Int64", "s": "String"})  # breaking: neither the table nor its view changes
    assert len(sink.statements) == 3


def test_no_view_with_none_and_a_named_one_elsewhere():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META})
    ddl.ClickHouseTables(sink, TARGET, TableDesign(("id",), current_view="NONE")).prepare(
        {"id": "Int64", "n": "Int32"}
    )
    assert sink.statements == []
    ddl.ClickHouseTables(sink, TARGET, TableDesign(("id",), current_view="bi.now")).exchange("__x")
    assert sink.statements == ["EXCHANGE TABLES `db`.`t__x` AND `db`.`t`", "CREATE DATABASE bi",
                               VIEW.replace("`db`.`t_current`", "`bi`.`now`")]  # fmt: skip


# -- on a cluster (the statements' syntax is ClickHouse's parser's to judge: tests/e2e/clickhouse/test_cluster_ddl.py)
LOCAL = "`db`.`t_local`"


def test_on_a_cluster_a_new_target_is_shard_tables_behind_a_distributed_table():
    sink = CatalogSink(None, placement=Cluster("main"))
    ddl.prepare_target(sink, TARGET, {"id": "Int64", "name": "Nullable(String)"}, TableDesign(("id",)), "hi")
    create_db, local, distributed = sink.statements
    assert create_db == "CREATE DATABASE db"
    assert local.startswith(f"CREATE TABLE IF NOT EXISTS {LOCAL} ON CLUSTER `main`")
    assert "ReplicatedReplacingMergeTree(" in local and "COMMENT 'hi'" in local
    assert distributed.startswith("CREATE TABLE IF NOT EXISTS `db`.`t` ON CLUSTER `main` AS `db`.`t_local`")
    assert distributed.endswith("ENGINE = Distributed(`main`, `db`, `t_local`, cityHash64(`id`))")


def test_on_a_cluster_columns_change_on_the_shards_then_on_the_distributed_table():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META}, placement=Cluster("main"))
    ddl.prepare_target(
        sink, TARGET, {"id": "Int64", "n": "Int64", "s": "Nullable(String)"}, TableDesign(("id",))
    )
    add = "ADD COLUMN IF NOT EXISTS `s` Nullable(String) AFTER `n`"
    assert sink.statements == [
        f"ALTER TABLE {LOCAL} ON CLUSTER `main` {add}",
        f"ALTER TABLE `db`.`t` ON CLUSTER `main` {add}",
        f"ALTER TABLE {LOCAL} ON CLUSTER `main` MODIFY COLUMN `n` Int64",
        "ALTER TABLE `db`.`t` ON CLUSTER `main` MODIFY COLUMN `n` Int64",
    ]


def test_on_a_cluster_a_swap_trades_the_shard_tables_and_follows_with_the_distributed_table():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META}, placement=Cluster("main"))
    tables = ddl.ClickHouseTables(sink, TARGET, TableDesign(("id",)))
    tables.exchange("__x")
    tables.drop("__x")
    assert sink.statements == [
        "EXCHANGE TABLES `db`.`t__x_local` AND `db`.`t_local` ON CLUSTER `main`",
        "CREATE OR REPLACE TABLE `db`.`t` ON CLUSTER `main` AS `db`.`t_local` "
        "ENGINE = Distributed(`main`, `db`, `t_local`, cityHash64(`id`))",
        VIEW.replace(" AS SELECT", " ON CLUSTER `main` AS SELECT"),
        "DROP TABLE IF EXISTS `db`.`t__x` ON CLUSTER `main` SYNC",
        "DROP TABLE IF EXISTS `db`.`t__x_local` ON CLUSTER `main` SYNC",
    ]


def test_on_one_server_a_swap_is_one_exchange():
    sink = CatalogSink({"id": "Int64", "n": "Int32", **META})
    ddl.ClickHouseTables(sink, TARGET, TableDesign(("id",))).exchange("__x")
    assert sink.statements == ["EXCHANGE TABLES `db`.`t__x` AND `db`.`t`", VIEW]  # the view's columns follow


def test_a_cluster_inserts_in_the_foreground_and_one_server_as_it_is():
    assert Cluster("main").client_settings == {"insert_distributed_sync": 1}
    assert OneServer().client_settings == {}


def test_the_embedded_engine_has_no_cluster(tmp_path):
    with pytest.raises(ConfigError, match="embedded engine, which is one process and has no cluster"):
        dsn.connect(f"chdb://{tmp_path}/db", cluster="main")
    assert not (tmp_path / "db").exists()
