"""`run --serve`'s HTTP side without an engine: addresses, TLS options, bounded decompression, credentials,
and the holder file that readers use to find the service."""

from __future__ import annotations

import base64
import gzip
import json
import os
from email.message import Message

import lz4.frame
import pytest

from cdc2ch.base.errors import ConfigError, SinkError
from cdc2ch.clickhouse.connection import embedded
from cdc2ch.clickhouse.serving import endpoint, httpservice, readonly, requestroute


def test_addresses():
    assert httpservice.parse_address("127.0.0.1:8123") == ("127.0.0.1", 8123)
    assert httpservice.parse_address("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert httpservice.parse_address("[::1]:8123") == ("::1", 8123)
    assert httpservice.parse_address("8123") == ("127.0.0.1", 8123)
    assert httpservice.parse_address(":8123") == ("0.0.0.0", 8123)
    for bad in ("host:port", "127.0.0.1:70000", ""):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            httpservice.parse_address(bad)


def test_tls_needs_both_files_that_exist(tmp_path):
    assert httpservice.tls_context(None, None) is None
    with pytest.raises(ConfigError, match="both --serve-tls-cert and --serve-tls-key"):
        httpservice.tls_context(str(tmp_path / "c.pem"), None)
    with pytest.raises(ConfigError, match="Cannot use the TLS certificate"):
        httpservice.tls_context(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))


def test_decompression_is_bounded():
    data = b"x" * 10_000
    assert httpservice.decompress(lz4.frame.compress(data) * 2, "lz4", 20_000) == data * 2
    assert httpservice.decompress(gzip.compress(data), "gzip", 10_000) == data
    for encoding, packed in (("lz4", lz4.frame.compress(data)), ("gzip", gzip.compress(data))):
        with pytest.raises(httpservice.ClientError) as err:
            httpservice.decompress(packed, encoding, 9_999)
        assert err.value.status == 413
    with pytest.raises(httpservice.ClientError) as err:
        httpservice.decompress(b"abc", "br", 100)
    assert err.value.status == 415
    # Found by test_fuzz_serve.py: bytes that are not what they claim were a 500 with Python's words.
    for encoding in ("gzip", "deflate", "lz4", "zstd"):
        with pytest.raises(
            httpservice.ClientError, match=f"not valid {encoding}|Truncated {encoding}"
        ) as err:
            httpservice.decompress(b"\x00\x00junk", encoding, 100)
        assert err.value.status == 400


def test_malformed_forms_are_the_clients_error():
    """Found by test_fuzz_serve.py: a body that is no form, a nested one, or one not in UTF-8 was a 500."""
    field = '--b\r\nContent-Disposition: form-data; name="query"\r\n\r\n{}\r\n--b--\r\n'
    assert httpservice.form_fields("multipart/form-data; boundary=b", field.format("SELECT 1").encode()) == {
        "query": "SELECT 1"
    }
    for body in (b"garbage", field.encode().replace(b"{}", b"\xff\xfe")):
        with pytest.raises(httpservice.ClientError, match="Malformed multipart") as err:
            httpservice.form_fields("multipart/form-data; boundary=b", body)
        assert err.value.status == 400


def _headers(**values) -> Message:
    msg = Message()
    for k, v in values.items():
        msg[k.replace("_", "-")] = v
    return msg


def test_credentials_as_clickhouse_takes_them():
    class H:
        def __init__(self, **headers):
            self.headers = _headers(**headers)

    basic = "Basic " + base64.b64encode(b"grafana:pa:ss").decode()
    creds = endpoint.ClickHouseHTTP._credentials
    assert creds(H(Authorization=basic), {}) == (True, "grafana", "pa:ss")
    assert creds(H(X_ClickHouse_User="u", X_ClickHouse_Key="k"), {}) == (True, "u", "k")
    assert creds(H(), {"user": "u", "password": "p"}) == (True, "u", "p")
    assert creds(H(), {}) == (False, "default", "")
    server = endpoint.ClickHouseHTTP(engine=None, user="default", password="s3cret")
    assert server._authenticated("default", "s3cret")
    assert not server._authenticated("default", "") and not server._authenticated("other", "s3cret")
    assert server.url == "http://default@127.0.0.1:0/"  # the user, never the password


def test_the_holder_file_announces_the_service(tmp_path):
    embedded._write_holder(tmp_path)
    embedded.announce_service(tmp_path, "http://default@127.0.0.1:8123/", None)
    info = json.loads((tmp_path / embedded.HOLDER_FILE).read_text())
    assert info["pid"] == os.getpid() and embedded._service(tmp_path) == {
        "url": "http://default@127.0.0.1:8123/"
    }
    embedded.withdraw_service(tmp_path)
    assert embedded._service(tmp_path) is None and "pid" in json.loads(
        (tmp_path / embedded.HOLDER_FILE).read_text()
    )


def test_read_only_serving_refuses_what_readonly_lets_through():
    """Found by test_fuzz_serve.py: on the embedded engine (one user with every grant, acting as its own
    client) `readonly=1` let these through: files written, queries killed, merges stopped, files read."""
    for sql in (
        "SELECT 1 INTO OUTFILE '/tmp/x'",
        "select 1 into /* c */ outfile '/tmp/x' format CSV",
        "KILL QUERY WHERE 1 SYNC",
        "SYSTEM STOP MERGES",
        "SELECT 1; SELECT 2",
        "SELECT 1;\n KILL QUERY WHERE 1",
        "DESCRIBE file('/etc/passwd', 'CSVWithNames')",
        "desc TABLE url('http://127.0.0.1:1/', 'CSV')",
        "EXPLAIN AST KILL QUERY WHERE 1",
        "EXPLAIN DESCRIBE file('/etc/passwd')",
        "SET readonly = 0",
        "USE system",
        "INSERT INTO t VALUES (1)",
        "SELECT $$a$$",
        "SELECT 1 # ; KILL QUERY WHERE 1",
        "",
        "-- only a comment",
    ):
        with pytest.raises(readonly.Refused, match=r"Code: 164\b.*\(READONLY\)"):
            readonly.check_statement(sql)
    for sql in (
        "SELECT 1",
        b"SELECT ';' AS x;;\n",
        "with 1 AS x SELECT x",
        "(SELECT 1) UNION ALL (SELECT 2)",
        "/* c; */ SELECT 'it''s; \\' INTO OUTFILE' -- ; trailing",
        "SELECT f(x) FROM t ORDER BY x DESC",
        "DESCRIBE TABLE db.t",
        "SHOW TABLES FROM db",
        "EXISTS db.t",
        "EXPLAIN PLAN header = 1 SELECT 1",
        'SELECT `a;b` FROM "c;d"',
        "SELECT '$$' /* ' ; KILL QUERY WHERE 1 -- */",
        "SELECT 'кот' AS \"ключ\"".encode(),
    ):
        readonly.check_statement(sql)
    for name in (
        "format_template_row",
        "format_schema",
        "output_format_schema",
        "input_format_record_errors_file_path",
    ):
        with pytest.raises(readonly.Refused, match=name):
            readonly.check_settings({name: "/etc/passwd"})
    readonly.check_settings({"max_execution_time": "10", "max_result_rows": "5"})


def test_an_error_answers_with_its_clickhouse_code_or_1001():
    """The code clients read from X-ClickHouse-Exception-Code: ClickHouse's own where the error has one, even
    behind other words, and std::exception's 1001 where it has none, also when `Code: ` is not followed by one."""
    assert endpoint.exception_code("Code: 60. DB::Exception: no table") == (
        60,
        "Code: 60. DB::Exception: no table",
    )
    assert endpoint.exception_code("insert failed: Code: 241. DB::Exception: memory") == (
        241,
        "Code: 241. DB::Exception: memory",
    )
    assert endpoint.exception_code("boom") == (1001, "Code: 1001. DB::Exception: boom")
    assert endpoint.exception_code("Code: none") == (1001, "Code: 1001. DB::Exception: Code: none")


class _NoEngine:
    """The endpoint's engine for tests of what never reaches one."""

    version, timezone = "26.9", "UTC"

    def open(self):
        return self

    def close(self) -> None:
        pass


def test_the_request_route_takes_checked_requests_and_nothing_else():
    """Issue 68, finding 1: `cdc2ch pause` reaches a read-only `run --serve` on a route of its own, whose
    fields are checked before the service's code records them; the client tells such a service from a
    ClickHouse server by its /ping answer."""
    taken: list[requestroute.Ask] = []

    def record(ask: requestroute.Ask) -> str:
        if ask.pipeline == "unknown":
            raise ConfigError("No pipeline named 'unknown' has a record. Nothing was changed.")
        if ask.pipeline == "broken":
            raise SinkError("ClickHouse failed to record the request.")
        taken.append(ask)
        return f"Pipeline {ask.pipeline} paused."

    service = endpoint.ClickHouseHTTP(_NoEngine(), password="pw", requests=record)  # type: ignore[arg-type]
    plain = endpoint.ClickHouseHTTP(_NoEngine(), password="pw")  # type: ignore[arg-type]
    with service, plain:
        client = {"host": "127.0.0.1", "port": service.port, "username": "default", "password": "pw"}
        assert requestroute.takes_requests(client)
        assert not requestroute.takes_requests(
            {**client, "port": plain.port}
        )  # no route: a server, to write to
        ask = requestroute.Ask("pause", "orders", "reloading", "sales", "me@here")
        assert requestroute.send(client, ask) == "Pipeline orders paused."
        assert taken == [ask]
        with pytest.raises(ConfigError, match="No pipeline named 'unknown'"):
            requestroute.send(client, requestroute.Ask("resync", "unknown"))
        with pytest.raises(SinkError, match=r"could not record the pause .*HTTP 500.*failed to record"):
            requestroute.send(client, requestroute.Ask("pause", "broken"))
        with pytest.raises(ConfigError, match="refused the credentials of user 'default'") as refused:
            requestroute.send({**client, "password": "wrong"}, ask)
        assert "wrong" not in str(refused.value)
        with pytest.raises(ConfigError, match="'action' must be one of pause, resume, resync"):
            requestroute.send(client, requestroute.Ask("resynced", "orders"))  # what only a service records
        with pytest.raises(SinkError, match="Cannot reach the cdc2ch service at http://default@127.0.0.1"):
            requestroute.send({**client, "port": _closed_port()}, ask)
    assert taken == [ask]


@pytest.mark.parametrize(
    "body, content_type, status, says",
    [
        (b"INSERT INTO t VALUES (1)", "text/plain", 415, "takes a JSON object"),
        (b"{", "application/json", 400, "not JSON"),
        (b'["pause"]', "application/json", 400, "must be a JSON object"),
        (b'{"action": "pause", "pipeline": "p", "query": "SELECT 1"}', "application/json", 400, "'query'"),
        (b'{"action": "drop", "pipeline": "p"}', "application/json", 400, "'action' must be one of"),
        (b'{"action": "pause"}', "application/json", 400, "'pipeline' must name"),
        (b'{"action": "pause", "pipeline": 7}', "application/json", 400, "'pipeline' must be a text"),
        (b'{"action": "pause", "pipeline": "p\\n"}', "application/json", 400, "control character"),
        (b'{"action": "pause", "pipeline": "p", "reason": "' + b"x" * 4001 + b'"}', "application/json", 400,
         "at most 4000"),
    ],
)  # fmt: skip
def test_a_request_is_parsed_strictly(body, content_type, status, says):
    with pytest.raises(httpservice.ClientError, match=says) as refused:
        requestroute.parse(body, content_type)
    assert refused.value.status == status
    ask = requestroute.parse(
        b'{"action": "resume", "pipeline": "p", "reason": null, "database": "db"}', "application/json"
    )
    assert ask == requestroute.Ask("resume", "p", "", "db", None)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
