"""Runs under the connector's own virtualenv (.venv-sharing): the official `delta-sharing` Python connector
reads what the test asks for (a JSON list of tasks on stdin) and prints what it read (JSON on stdout).

Each task: {"kind": "list", "profile": p} | {"kind": "snapshot", "url": u, "version": v|None, "types": {...}}
| {"kind": "changes", "url": u, "start": a, "end": b, "types": {...}}. Each result: {"columns", "rows"} with
rows canonicalised by tests/support/sharing_canon.py, {"shares", "tables"} for a listing, or {"error", "status",
"message"} when the connector raised (with the server's "errorCode" and "message" when it answered JSON).
"""

import contextlib
import json
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
    if task["kind"] == "snapshot":
        df = delta_sharing.load_as_pandas(task["url"], version=task.get("version"))
    else:
        df = delta_sharing.load_table_changes_as_pandas(task["url"], task["start"], task["end"])
    columns = [str(c) for c in df.columns]
    types = {c: task["types"].get(c, "string") for c in columns}
    return {"columns": columns, "rows": canon_rows(df.to_dict("records"), columns, types)}


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


if __name__ == "__main__":
    main()
