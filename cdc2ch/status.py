"""Per-pipeline replication status: stored offsets next to the Delta tables' latest versions."""

from __future__ import annotations

from collections.abc import Callable

from cdc2ch.config import TargetName
from cdc2ch.errors import Cdc2chError
from cdc2ch.sink import Sink
from cdc2ch.source.delta import DeltaSource
from cdc2ch.state import StateStore, databases_with_state

COLUMNS = (
    "pipeline",
    "target",
    "committed_version",
    "latest_version",
    "versions_behind",
    "rows_written",
    "last_sync",
    "source",
    "error",
)


def collect(sink: Sink, spark_factory: Callable[[], object], target: TargetName | None = None) -> list[dict]:
    databases = [target.database] if target else databases_with_state(sink)
    states = [s for db in databases for s in StateStore(sink, db).load_all()]
    if target:
        states = [s for s in states if s.target == str(target)]
    out = []
    for st in states:
        row = {
            "pipeline": st.pipeline,
            "target": st.target,
            "committed_version": st.committed_version,
            "latest_version": None,
            "versions_behind": None,
            "rows_written": st.rows_written,
            "last_sync": st.updated_at.isoformat(timespec="milliseconds"),
            "source": st.source,
            "error": None,
        }
        try:
            latest = DeltaSource(spark_factory(), st.source).latest().version
            row["latest_version"] = latest
            row["versions_behind"] = max(0, latest - st.committed_version)
        except Cdc2chError as exc:
            row["error"] = str(exc)
        out.append(row)
    return out


def aligned(header: list[str], rows: list[list], empty: str = "-") -> list[str]:
    """Rows as left-aligned text columns under a header line."""
    cells = [[empty if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *cells]]


def render_table(rows: list[dict]) -> str:
    if not rows:
        return "No pipelines found."
    cols = [c for c in COLUMNS if c != "error" or any(r["error"] for r in rows)]
    return "\n".join(aligned(cols, [[r[c] for c in cols] for r in rows]))
