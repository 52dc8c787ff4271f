"""Runs under the connector's own virtualenv (.venv-sharing): the official `delta-sharing` Python connector
reads what the test asks for (a JSON list of tasks on stdin) and prints what it read (JSON on stdout).

Each task: {"kind": "list", "profile": p} | {"kind": "snapshot", "url": u, "version": v|None, "types": {...}}
| {"kind": "changes", "url": u, "start": a, "end": b, "types": {...}} | {"kind": "since", ...as changes}. Each
result: {"columns", "rows"} with rows canonicalised by tests/support/sharing_canon.py, {"shares", "tables"} for
a listing, or {"error", "status", "message"} when the connector raised (with the server's "errorCode" and
"message" when it answered JSON).

"since" is a query since a version (POST /query with startingVersion and endingVersion), which the connector's
public functions do not issue (its Spark source does, for streaming): its own parts take it instead. Its REST
client posts the query; its protocol classes parse the protocol, the metaData and each file line (any other
line fails the task); its reader reads each file as it reads a change data feed's, an `add` file's rows
`insert` and a `remove` file's `delete`, with the line's version and timestamp. The result also says the
answer's Delta-Table-Version and the versions of the metaData lines after the first.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import delta_sharing  # noqa: E402
from sharing_canon import canon_rows  # noqa: E402


def run(task: dict) -> dict:
    if task["kind"] == "list":
        client = delta_sharing.SharingClient(task["profile"])
        tables = client.list_all_tables()
        by_schema = [
            t
            for share in client.list_shares()
            for s in client.list_schemas(share)
            for t in client.list_tables(s)
        ]
        return {
            "shares": sorted(s.name for s in client.list_shares()),
            "tables": sorted(f"{t.share}.{t.schema}.{t.name}" for t in tables),
            "tables_by_schema": sorted(f"{t.share}.{t.schema}.{t.name}" for t in by_schema),
        }
    if task["kind"] == "since":
        return since(task)
    if task["kind"] == "snapshot":
        df = delta_sharing.load_as_pandas(task["url"], version=task.get("version"))
    else:
        df = delta_sharing.load_table_changes_as_pandas(task["url"], task["start"], task["end"])
    columns = [str(c) for c in df.columns]
    types = {c: task["types"].get(c, "string") for c in columns}
    return {"columns": columns, "rows": canon_rows(df.to_dict("records"), columns, types)}


def since(task: dict) -> dict:
    import pandas as pd
    from delta_sharing.converter import to_converters
    from delta_sharing.delta_sharing import _parse_url
    from delta_sharing.protocol import DeltaSharingProfile, FileAction, Metadata, Protocol
    from delta_sharing.reader import DeltaSharingReader
    from delta_sharing.rest_client import DataSharingRestClient

    profile, share, schema, table = _parse_url(task["url"])
    client = DataSharingRestClient(DeltaSharingProfile.read_from_file(profile))
    body = {"startingVersion": task["start"], "endingVersion": task["end"]}
    target = f"/shares/{share}/schemas/{schema}/tables/{table}/query"
    with client._post_internal(target, data=body, return_headers=True) as (headers, lines):
        answered = int(headers["delta-table-version"])
        Protocol.from_json(json.loads(next(lines))["protocol"])
        meta = Metadata.from_json(json.loads(next(lines))["metaData"])
        rest = [json.loads(line) for line in lines]
    later = [Metadata.from_json(r["metaData"]).version for r in rest if "metaData" in r]
    actions = [FileAction.from_json(r) for r in rest if "metaData" not in r]
    if any(a is None for a in actions):
        raise ValueError(f"lines that are no metaData and no file: {rest}")
    schema_json = json.loads(meta.schema_string)
    converters = to_converters(schema_json)
    read = [
        DeltaSharingReader._to_pandas(a, converters, True, None, False)
        for a in actions
        if task["start"] <= a.version <= task["end"]  # (endingVersion is a hint)
    ]
    columns = [f["name"] for f in schema_json["fields"]] + [
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    df = pd.concat(read, ignore_index=True) if read else pd.DataFrame(columns=columns)
    types = {c: task["types"].get(c, "string") for c in columns}
    rows = canon_rows(df[columns].to_dict("records"), columns, types)
    return {"columns": columns, "rows": rows, "version": answered, "metadata_versions": later}


def main() -> None:
    results = []
    for task in json.load(sys.stdin):
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the connector prints progress now and then
                results.append(run(task))
        except Exception as e:  # reported, for the test to judge
            response = getattr(e, "response", None)
            status = getattr(response, "status_code", None) or getattr(e, "status", None)
            try:  # the server's own {"errorCode", "message"}, which the connector pretty-prints into its message
                detail = json.loads(response.text)
            except Exception:
                detail = {}
            results.append({"error": type(e).__name__, "status": status, "message": str(e), **detail})
    json.dump(results, sys.stdout)
    sys.stdout.flush()
    sys.stderr.flush()
    # pyarrow's reader threads may still be alive at interpreter teardown, where they abort the process
    # ("terminate called without an active exception", apache/arrow#34314) after the answer is complete.
    os._exit(0)


if __name__ == "__main__":
    main()
