"""The one line `run --once`, `snapshot` and `reshape` end with, on stdout at any log level: what each
pipeline wrote (rows, versions), or the totals of many, and the time taken."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cdc2ch.base import log

MANY = 5  # pipelines beyond which the line gives totals, not each pipeline


@dataclass(frozen=True)
class Written:
    """What one pipeline's run or load wrote."""

    pipeline: str
    rows: int = 0
    before: int | None = None  # the committed version it began at (None: not known, or a snapshot)
    after: int | None = None  # the committed version it ended at (None: it never started)
    failed: str | None = None  # the kind of error its last attempt failed with
    snapshot: bool = False  # a snapshot of version `after` was loaded
    note: str | None = None  # what happened instead, in words

    def describe(self) -> str:
        if self.note is not None:
            return self.note
        if self.failed is not None:
            return f"failed ({self.failed}; `cdc2ch status` has the whole error)"
        if self.after is None:
            return "not started"
        if self.snapshot:
            return f"snapshot of version {self.after} loaded, {self.rows:,} rows"
        if self.before is not None and self.after > self.before:
            span = (
                f"version {self.after}"
                if self.after == self.before + 1
                else f"versions {self.before + 1}..{self.after}"
            )
            return f"{span} replicated, {self.rows:,} rows written"
        return f"up to date at version {self.after}, nothing written"

    @property
    def advanced(self) -> bool:
        return self.failed is None and self.after is not None and (self.snapshot or self.after != self.before)


def line(written: list[Written], seconds: float, stopped: bool = False) -> str:
    """The summary of `written`, in words: each pipeline when there are few, else the totals."""
    took = f"in {seconds:.1f}s" + (" (stopped)" if stopped else "")
    if len(written) == 1:
        return f"{written[0].pipeline}: {written[0].describe()}, {took}"
    rows = sum(w.rows for w in written)
    head = f"{len(written)} pipelines, {rows:,} rows written {took}"
    if len(written) <= MANY:
        return f"{head}: " + "; ".join(f"{w.pipeline} {w.describe()}" for w in written)
    failed = sum(w.failed is not None for w in written)
    advanced = sum(w.advanced for w in written)
    return f"{head}: {advanced} advanced, {len(written) - advanced - failed} unchanged, {failed} failed"


def render(command: str, written: list[Written], seconds: float, stopped: bool = False) -> str:
    """The line as printed: words on the console, a JSON `summary` event with --log-format json."""
    return log.summary(
        line(written, seconds, stopped),
        command=command,
        seconds=round(seconds, 3),
        rows=sum(w.rows for w in written),
        stopped=stopped,
        pipelines=[asdict(w) for w in written],
    )


def of_slots(slots: list) -> list[Written]:
    """What the runner's pipelines (fleet.runner.Slot) wrote in this run."""
    out = []
    for slot in slots:
        job, kind = slot.job, slot.health.last_error_kind if slot.error is not None else None
        began, ended = (job.started, job.state) if job is not None else (None, None)
        out.append(
            Written(
                slot.cfg.pipeline,
                rows=max(ended.rows_written - began.rows_written, 0) if began and ended else 0,
                before=began.committed_version if began else None,
                after=ended.committed_version if ended else None,
                failed=kind,
            )
        )
    return out


def reshaped(pipeline: str, done) -> str:
    """The line of a reshape (commands.reshape.Reshaped), or of one stopped before its swap (None)."""
    if done is None:
        text = f"{pipeline}: reshape stopped before the swap; the same command resumes it"
        return log.summary(text, command="reshape", pipeline=pipeline, stopped=True)
    text = (
        f"{done.pipeline}: {done.target} reshaped at version {done.version}, {done.rows:,} rows loaded, "
        f"in {done.seconds:.1f}s"
    )
    fields = {"target": done.target, "version": done.version, "rows": done.rows}
    return log.summary(text, command="reshape", pipeline=pipeline, **fields, seconds=round(done.seconds, 3))
