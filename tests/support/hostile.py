"""What an attacker sends to `cdc2ch run --serve`, as Hypothesis strategies: statements and URL settings
that would lift `readonly`, and raw requests no client library would send (tests/e2e/clickhouse/test_fuzz_serve.py)."""

from __future__ import annotations

from hypothesis import strategies as st

# -- statements and settings that would lift readonly --------------------------------------------------------
HOSTILE = [
    "INSERT INTO cdc2ch.t (id, v) VALUES (-1000, 'x')",
    "INSERT INTO cdc2ch.t SELECT -1000, 'x', 0, 0, 0",
    "INSERT INTO FUNCTION file('{out}/i.csv', 'CSV') SELECT 1",
    "CREATE TABLE cdc2ch.evil (id Int64) ENGINE = Memory",
    "CREATE DATABASE evil",
    "CREATE TEMPORARY TABLE evil (id Int64)",
    "CREATE USER evil",
    "GRANT ALL ON *.* TO default",
    "DROP TABLE cdc2ch.t",
    "DROP DATABASE cdc2ch",
    "TRUNCATE TABLE cdc2ch.t",
    "ALTER TABLE cdc2ch.t DELETE WHERE 1",
    "ALTER TABLE cdc2ch.t ADD COLUMN evil Int64",
    "RENAME TABLE cdc2ch.t TO cdc2ch.t2",
    "DETACH TABLE cdc2ch.t",
    "ATTACH TABLE cdc2ch.evil (id Int64) ENGINE = Log",
    "OPTIMIZE TABLE cdc2ch.t FINAL",
    "SYSTEM STOP MERGES",
    "SYSTEM STOP MERGES cdc2ch.t",
    "SYSTEM DROP MARK CACHE",
    "SYSTEM FLUSH LOGS",
    "SYSTEM SHUTDOWN",
    "KILL QUERY WHERE 1",
    "KILL QUERY WHERE query ILIKE '%INSERT%' SYNC",
    "KILL MUTATION WHERE 1",
    "SET readonly = 0",
    "SET allow_ddl = 1",
    "USE system",
    "SELECT count() FROM cdc2ch.t SETTINGS readonly = 0",
    "SELECT 1 SETTINGS readonly = 2",
    "SELECT * FROM file('{secret}', 'LineAsString')",
    "SELECT * FROM file('{secret}')",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
    "SELECT * FROM s3('http://127.0.0.1:1/bucket/key.csv', 'CSV')",
    "SELECT * FROM deltaLakeLocal('{root}/t')",
    "SELECT * FROM remote('127.0.0.1:1', system.one)",
    "SELECT * FROM executable('cat {secret}', 'TSV', 'x String')",
    "SELECT * FROM loop(file('{secret}', 'LineAsString')) LIMIT 1",
    "DESCRIBE file('{secret}', 'CSVWithNames')",
    "DESCRIBE TABLE url('http://127.0.0.1:1/x', 'CSVWithNames')",
    "DESC (SELECT * FROM file('{secret}', 'LineAsString'))",
    "EXPLAIN DESCRIBE file('{secret}')",
    "SELECT 1 INTO OUTFILE '{out}/o.txt'",
    "SELECT * FROM cdc2ch.t INTO OUTFILE '{out}/o.csv' TRUNCATE FORMAT CSV",
    "SELECT 1 INTO OUTFILE '{out}/o.txt' AND STDOUT",
    "BACKUP TABLE cdc2ch.t TO File('{out}/b')",
    "SELECT 1; DROP TABLE cdc2ch.t",
    "SELECT 1;KILL QUERY WHERE 1",
    "SELECT $$x$$; SYSTEM STOP MERGES",
    "SELECT 1 # comment\n; SYSTEM STOP MERGES",
]
# URL settings: any of these with a statement refused above keeps it refused; those naming files refuse any.
SETTINGS = {
    "readonly": ["0", "2"],
    "allow_ddl": ["1"],
    "format_template_row": ["{secret}"],
    "format_template_resultset": ["{secret}"],
    "format_schema": ["{secret}:M"],
    "output_format_schema": ["{out}/schema.capnp"],
    "input_format_record_errors_file_path": ["{out}/errors"],
    "max_execution_time": ["5"],
    "max_threads": ["1"],
}
FILE_SETTINGS = {"format_template_row", "format_template_resultset", "format_schema", "output_format_schema"}


@st.composite
def hostile_requests(draw):
    """(statement, URL parameters, headers, how the statement travels) for one hostile request."""
    sql = draw(st.sampled_from(HOSTILE))
    case = draw(st.sampled_from([str, str.lower, str.upper, str.swapcase]))
    words = sql.split(" ")
    if case is not str:  # keywords in any case; paths and literals as they are
        words = [w if "'" in w or "{" in w else case(w) for w in words]
    gap = draw(st.sampled_from([" ", "  ", "\n", "\t", " /* ; */ ", " -- c\n"]))
    text = draw(st.sampled_from(["", "  ", "/* lead */ ", "\n"])) + gap.join(words)
    text += draw(st.sampled_from(["", ";", " ;;", "\n", " -- trailing"]))
    params = {}
    for name in draw(st.lists(st.sampled_from(sorted(SETTINGS)), max_size=3, unique=True)):
        params[name] = draw(st.sampled_from(SETTINGS[name]))
    if draw(st.booleans()):
        params["default_format"] = draw(st.sampled_from(["TSV", "Template", "JSONEachRow", "Protobuf"]))
    headers = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "X-ClickHouse-Format": st.sampled_from(["TSV", "Template"]),
                "X-ClickHouse-Database": st.sampled_from(["system", "cdc2ch", "`x`; DROP"]),
                "X-ClickHouse-Setting": st.just("readonly=0"),
                "X-ClickHouse-Quota": st.just("q"),
            },
        )
    )
    travel = draw(st.sampled_from(["body", "query", "split", "multipart"]))
    return text, params, headers, travel


# -- malformed HTTP ----------------------------------------------------------------------------------------
_token = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_junk = st.binary(max_size=200)


INJECT = b"/?query_id=a%0d%0aSet-Cookie:%20evil=1&query=SELECT%201"  # a header of the client's making
REFUSALS = {
    400,
    401,
    403,
    404,
    405,
    408,
    411,
    413,
    414,
    415,
    431,
    501,
    505,
}  # the client's fault, or unsupported


@st.composite
def malformed(draw):
    """Raw bytes of a request no client library would send, and whether it asks for /ping."""
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"HEAD", b"", b"G\x00ET"]))
    path = draw(
        st.sampled_from(
            [b"/", b"/ping", b"/?query=SELECT%201", b"*", b"", b"/" + b"a" * 70000, b"/%ff%00", INJECT]
        )
        | _junk.map(lambda b: b"/" + b.replace(b"\r", b"").replace(b"\n", b""))
    )
    version = draw(
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9", b"HTTP/2.0", b"HTTP/9", b"", b"XYZ"])
    )
    lines = [b" ".join(p for p in (method, path, version) if p)]
    body = draw(_junk)
    framing = draw(
        st.sampled_from(["length", "short", "long", "negative", "junk", "chunked", "bad-chunk", "none"])
    )
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
    elif framing == "short":  # claims less than it sends: the rest is read as the next request
        lines.append(b"Content-Length: %d" % (len(body) // 2))
    elif framing == "long":  # claims more than it sends, then stops sending
        lines.append(b"Content-Length: %d" % (len(body) + draw(st.integers(1, 1 << 40))))
    elif framing == "negative":
        lines.append(b"Content-Length: -%d" % draw(st.integers(1, 1 << 20)))
    elif framing == "junk":
        lines.append(
            b"Content-Length: " + draw(st.sampled_from([b"1_0", b"+5", b"0x10", b"1e3", b" ", b"\xff"]))
        )
    elif framing in ("chunked", "bad-chunk"):
        lines.append(b"Transfer-Encoding: chunked")
        size = (
            b"%x" % len(body)
            if framing == "chunked"
            else draw(st.sampled_from([b"-1", b"zz", b"0x5", b"+3", b""]))
        )
        body = size + b"\r\n" + body + b"\r\n0\r\n\r\n"
    for _ in range(draw(st.integers(0, 3))):
        start = [b"X-Junk: ", b"NoColon", b"\x00\xff: x", b"Host: ", b"Authorization: Basic "]
        lines.append(draw(st.sampled_from(start)) + draw(_token).encode())
    if draw(st.booleans()):
        lines.append(b"X-Big: " + b"x" * draw(st.sampled_from([100, 70000])))
    # A client that keeps its side open must be answered or dropped all the same, unless it promised more.
    half_close = framing == "long" or draw(st.booleans())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body, path.startswith(b"/ping"), half_close
