"""Delta Sharing without a JVM or a server: profiles, `--table` references, the file plan and the task-side
reader (over file:// URLs), Retry-After."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc2ch.base import retry
from cdc2ch.base.errors import ConfigError
from cdc2ch.model.tableref import parse_table
from cdc2ch.source.sharing import sharefiles
from cdc2ch.source.sharing.restclient import load_profile, retry_after

pytestmark = pytest.mark.unit
TOKEN = "dapi-very-secret-token"


def _profile(tmp_path, **fields):
    path = tmp_path / "config.share"
    path.write_text(json.dumps(fields))
    return str(path)


def test_bearer_profile_is_read_and_its_token_kept_out_of_repr(tmp_path):
    later = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    path = _profile(tmp_path, shareCredentialsVersion=1, endpoint="https://h/ds/", bearerToken=TOKEN,
                    expirationTime=later)  # fmt: skip
    p = load_profile(path)
    assert p.endpoint == "https://h/ds" and p.bearer_token == TOKEN and p.expiration is not None
    assert TOKEN not in repr(p)


def test_oauth_client_credentials_profile(tmp_path):
    path = _profile(tmp_path, shareCredentialsVersion=2, type="oauth_client_credentials", endpoint="https://h/ds",
                    tokenEndpoint="https://idp/token/", clientId="c", clientSecret=TOKEN, scope="s")  # fmt: skip
    p = load_profile(path)
    assert (p.token_endpoint, p.client_id, p.scope) == ("https://idp/token", "c", "s")
    assert TOKEN not in repr(p)


@pytest.mark.parametrize(
    "fields, says",
    [
        (None, "does not exist"),
        ("not json", "is not a JSON object"),
        ({"endpoint": "https://h"}, "shareCredentialsVersion"),
        ({"shareCredentialsVersion": 1, "endpoint": "ftp://h", "bearerToken": TOKEN}, "http(s) endpoint"),
        ({"shareCredentialsVersion": 1, "endpoint": "https://h"}, "no bearerToken"),
        ({"shareCredentialsVersion": 3, "endpoint": "https://h", "bearerToken": TOKEN}, "does not read"),
        ({"shareCredentialsVersion": 2, "type": "oauth_client_credentials", "endpoint": "https://h"}, "clientSecret"),
        (
            {"shareCredentialsVersion": 1, "endpoint": "https://h", "bearerToken": TOKEN,
             "expirationTime": "2020-01-01T00:00:00Z"},
            "expired at 2020-01-01",
        ),
    ],
)  # fmt: skip
def test_bad_profiles_are_one_paragraph_without_the_token(tmp_path, fields, says):
    path = str(tmp_path / "config.share")
    if fields is not None:
        (tmp_path / "config.share").write_text(fields if isinstance(fields, str) else json.dumps(fields))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    text = str(err.value)
    assert says in text and path in text and TOKEN not in text and "\n" not in text


def test_table_reference_forms(tmp_path):
    ref = parse_table("config.share#sales_share.sales.orders")
    assert ref.is_shared and not ref.is_name and ref.last == "orders"
    assert ref.shared == ("sales_share", "sales", "orders")
    assert ref.uri.endswith("/config.share#sales_share.sales.orders") and ref.uri.startswith("/")
    assert parse_table("/p/x.share#a.b.c.d").shared == ("a.b", "c", "d")  # share names may hold dots
    assert not parse_table("/lake/orders").is_shared and parse_table("sales.orders").is_name
    for bad in ("x.share#a.b", "#a.b.c", "x.share#a..c", "x.share#a.b c.d"):
        with pytest.raises(ConfigError, match="Delta Sharing table"):
            parse_table(bad)


def _action(kind, v, fid, **extra):
    return {kind: {"url": f"https://s/{fid}?sig={v}", "id": fid, "version": v, "timestamp": 1000 * v,
                   "partitionValues": {}, "size": 10, **extra}}  # fmt: skip


def test_plan_follows_the_cdf_rule_and_is_stable():
    lines = [
        {"protocol": {"minReaderVersion": 1}},
        _action("add", 1, "f1"),
        _action("remove", 2, "f1"),
        _action("add", 2, "f2"),
        _action("cdf", 2, "c2"),  # version 2 has change files: its add/remove are not changes
        _action("remove", 3, "f2"),
    ]
    rows = sharefiles.plan_files(lines)
    assert [(r["version"], r["id"], r["change"]) for r in rows] == [
        (1, "f1", "insert"), (2, "c2", None), (3, "f2", "delete")]  # fmt: skip
    again = sharefiles.plan_files(list(reversed(lines)))
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    snap = sharefiles.plan_files([_action("file", 5, "b"), _action("file", 5, "a")], snapshot=True)
    assert [r["id"] for r in snap] == ["a", "b"]
    assert sharefiles.tasks_for([{"size": 200 << 20}] * 3) == 3 and sharefiles.tasks_for([]) == 1


def test_task_reader_casts_fills_partitions_and_adds_cdf_columns(tmp_path):
    data = tmp_path / "part.parquet"
    pq.write_table(pa.table({"ID": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}), data)
    cdf = tmp_path / "cdf.parquet"
    pq.write_table(pa.table({"id": [3], "name": ["c"], "_change_type": ["update_postimage"]}), cdf)
    target = pa.schema([("id", pa.int64()), ("name", pa.string()), ("day", pa.date32()), ("added", pa.float64()),
                        ("_change_type", pa.string()), ("_commit_version", pa.int64()),
                        ("_commit_timestamp", pa.timestamp("us", tz="UTC"))])  # fmt: skip
    files = pa.RecordBatch.from_pylist(
        [
            {"url": data.as_uri(), "id": "a", "version": 4, "timestamp": 1_700_000_000_000, "change": "delete",
             "partition": json.dumps({"day": "2024-02-29"}), "size": 1},
            {"url": cdf.as_uri(), "id": "b", "version": 5, "timestamp": 1_700_000_001_000, "change": None,
             "partition": json.dumps({"day": ""}), "size": 1},
        ]
    )  # fmt: skip
    out = pa.Table.from_batches(
        list(sharefiles.reader(target, ["id", "name", "day", "added"], False)([files]))
    )
    assert out.schema == target
    rows = out.to_pylist()
    assert [(r["id"], r["day"] and r["day"].isoformat(), r["added"], r["_change_type"], r["_commit_version"])
            for r in rows] == [(1, "2024-02-29", None, "delete", 4), (2, "2024-02-29", None, "delete", 4),
                               (3, None, None, "update_postimage", 5)]  # fmt: skip
    assert rows[0]["_commit_timestamp"] == datetime.fromtimestamp(1_700_000_000, timezone.utc)


def test_retry_after_is_honoured_up_to_the_cap():
    assert retry_after("7") == 7.0 and retry_after(None) is None and retry_after("soon") is None
    waits = []

    class Busy(Exception):
        retry_after = 3.0

    calls = iter([Busy(), Busy(), "ok"])

    def fn():
        v = next(calls)
        if isinstance(v, Exception):
            raise v
        return v

    got = retry.call(fn, 5, lambda e: True, base=0.5, max_wait=2.5, sleep=waits.append,
                     hint=lambda e: getattr(e, "retry_after", None))  # fmt: skip
    assert got == "ok" and waits == [2.5, 2.5]


def test_a_range_cut_from_a_wider_answer_keeps_the_schema_it_is_read_under():
    """One /changes answer for [0, 3] serves the later range [2, 3] too; that range changes no schema,
    so it is read under the metaData of version 1 (the head line of the answer is version 0's)."""
    from cdc2ch.source.sharing.shareanswer import metadata_of, sliced

    def meta(v, cols):
        return {"metaData": {"version": v, "schemaString": json.dumps({"type": "struct", "fields": cols})}}

    def add(v):
        return {"add": {"url": f"u{v}", "version": v, "timestamp": 1, "size": 1}}

    a, b = [{"name": "id"}], [{"name": "id"}, {"name": "x"}]
    lines = [{"protocol": {"minReaderVersion": 1}}, meta(0, a), add(0), meta(1, b), add(1), add(2), add(3)]
    part = sliced(lines, 2, 3)
    assert [ln for ln in part if "add" in ln] == [add(2), add(3)]
    assert json.loads(metadata_of(part, 3)["schemaString"])["fields"] == b
    assert metadata_of(sliced(lines, 0, 0), 0)["version"] == 0
    assert metadata_of(sliced(lines, 1, 1), 1)["version"] == 1
    assert metadata_of(sliced(lines[:3] + [add(1)], 1, 1), 1)["version"] == 0
    assert sliced(lines, 0, 3) == lines


def test_a_task_downloads_in_a_plain_loop_without_tenacity(monkeypatch):
    """The reader a Spark task runs carries no tenacity (a copy shipped by value could meet one imported by
    reference in a reused worker); its loop retries what is transient, honours Retry-After up to the cap, and
    turns a refused URL into EXPIRED at once."""
    import io
    import urllib.error

    from pyspark import cloudpickle

    from cdc2ch.source.spark.session import shipped_by_value

    with shipped_by_value(sharefiles):
        blob = cloudpickle.dumps(sharefiles.reader(pa.schema([("id", pa.int64())]), ["id"], True))
    assert b"tenacity" not in blob

    def http(code, retry_after=None):
        headers = {"Retry-After": retry_after} if retry_after else {}
        return urllib.error.HTTPError("u", code, "x", headers, io.BytesIO())  # type: ignore[arg-type]

    answers: list = []

    class Body(io.BytesIO):
        def __enter__(self):
            return self

    def urlopen(request, timeout):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Body(answer)

    monkeypatch.setattr(sharefiles.urllib.request, "urlopen", urlopen)
    waits: list[float] = []
    answers[:] = [http(503), http(429, "99"), ConnectionResetError("reset"), b"PAR1"]
    assert sharefiles.fetch("https://s/f", sleep=waits.append) == b"PAR1"
    assert 0.25 <= waits[0] <= 0.5 and waits[1] == sharefiles.MAX_WAIT and 1.0 <= waits[2] <= 2.0
    answers[:] = [http(500), http(500)]
    with pytest.raises(sharefiles.Transient, match="HTTP 500"):
        sharefiles.fetch("https://s/f", attempts=2, sleep=waits.append)
    answers[:] = [http(403)]
    with pytest.raises(RuntimeError, match=sharefiles.EXPIRED):
        sharefiles.fetch("https://s/f", sleep=waits.append)
    assert answers == []


def test_a_query_since_a_version_lists_the_versions_and_plans_inserts_and_deletes(tmp_path):
    """A table shared with history whose feed is not recorded from version 3: the server refuses /changes,
    and a query since version 3 answers each version's added and removed files (and versions after the
    endingVersion it was given as a hint). Commits come from that answer, the feed counted from the metaData
    that enables it; a range's rows are its added files' inserts and removed files' deletes."""
    from cdc2ch.model.changeset import FEED, LOG
    from cdc2ch.replication import plan
    from cdc2ch.source.sharing.restclient import SharingRefused
    from cdc2ch.source.sharing.sharedsource import SharedSource

    def meta(v, conf):
        schema = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long"}]})
        return {"metaData": {"id": "t", "version": v, "schemaString": schema, "configuration": conf,
                             "format": {"provider": "parquet"}}}  # fmt: skip

    def file(kind, v, fid, rows=None):
        line = _action(kind, v, fid)
        if rows is not None:
            line[kind]["stats"] = json.dumps({"numRecords": rows})
        return line

    since = [
        {"protocol": {"minReaderVersion": 1}},
        meta(3, {}),
        file("add", 3, "a", 4),
        file("remove", 4, "a"),
        file("add", 4, "b", 3),  # a rewrite: b holds a's rows but one
        file("remove", 5, "b"),
        meta(6, {"enableChangeDataFeed": "true"}),
        file("add", 7, "late", 1),  # after the endingVersion asked: the protocol makes it a hint
    ]
    asked: list[tuple] = []

    class Server:
        def changes(self, start, end):
            asked.append(("changes", start, end))
            raise SharingRefused(400, "INVALID_PARAMETER_VALUE", "change data was not recorded for version [3]",
                                 "/changes", "s.d.t", "https://h")  # fmt: skip

        def query_since(self, start, end):
            asked.append(("query", start, end))
            return [
                ln
                for ln in since
                if ln.get("metaData", {}).get("version", start) >= start or "protocol" in ln
            ]

        def version(self):
            return 6

    profile = _profile(tmp_path, shareCredentialsVersion=1, endpoint="https://h/ds", bearerToken=TOKEN)
    source = SharedSource(None, f"{profile}#s.d.t")
    source.client = source._answers.client = Server()  # type: ignore[assignment]
    commits = source.commits(3, 6)
    assert [(c.version, c.estimated_rows > 0, c.metadata) for c in commits] == [
        (3, True, True), (4, True, False), (5, True, False), (6, False, True)]  # fmt: skip
    assert commits[3].properties == {"enableChangeDataFeed": "true", "delta.enableChangeDataFeed": "true"}
    assert asked == [("changes", 3, 6), ("query", 3, 6)]
    fed = plan.feed_versions(plan.records_feed(source.properties(2)), commits)
    assert fed == {6} and asked[-1] == ("query", 2, 2)
    assert [plan.origin("auto", fed, s, e) for s, e in ((3, 5), (6, 6))] == [LOG, FEED]

    changes = source.changes(3, 5, origin=LOG)  # cut from the answer the commits were listed from
    assert changes.origin == LOG and asked[-1] == ("query", 2, 2)
    planned = sharefiles.plan_files(changes._lines)
    assert [(r["version"], r["id"], r["change"]) for r in planned] == [
        (3, "a", "insert"), (4, "a", "delete"), (4, "b", "insert"), (5, "b", "delete")]  # fmt: skip
    assert [f["name"] for f in changes.schema["fields"]] == [
        "id", "_change_type", "_commit_version", "_commit_timestamp"]  # fmt: skip
    assert [ln for ln in source._lines(6, 6, LOG) if "add" in ln] == []  # version 7: past the range asked
