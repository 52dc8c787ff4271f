"""Builds deploy/grafana/cdc2ch.json, the Grafana dashboard of `cdc2ch run --metrics-port`, with Grafana's own
Foundation SDK (the `grafana-foundation-sdk` package, in the `test` extra).

    python deploy/grafana/build.py           # write cdc2ch.json
    python deploy/grafana/build.py --check   # exit 1 if cdc2ch.json is not what this builds

Every query selects its series with `{instance=~"$instance", pipeline=~"$pipeline"}` (the process metrics,
which have no pipeline, with the instance alone); tests/e2e/deploy/test_prometheus.py checks that each names a metric
a running cdc2ch exports and that a real Prometheus answers it. deploy/README.md says what each panel answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

OUT = Path(__file__).with_name("cdc2ch.json")
UID = "cdc2ch"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
PIPE = 'instance=~"$instance", pipeline=~"$pipeline"'  # the selector of every per-pipeline series
PROC = 'instance=~"$instance"'  # the process's own series (no pipeline label)
BUCKETS = f"rate(cdc2ch_batch_seconds_bucket{{{PIPE}}}[$__rate_interval])"
RATE = "$__rate_interval"


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def series(title: str, description: str, unit: str, *queries: prometheus.Dataquery, bars: bool = False):
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .min(0)
        .height(8)
        .span(12)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )  # fmt: skip
    )
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    for q in queries:
        panel = panel.with_target(q)
    return panel


def worst(title: str, description: str, unit: str, expr: str, legend: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .height(4)
        .span(6)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(query(expr, legend))
    )


def variable(name: str, label: str, query_text: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .query(query_text)
        .datasource(DS)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text="All", value="$__all"))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def dashboard() -> dict:
    lag = db.Row("Lag: how far behind Delta is each pipeline?")
    throughput = db.Row("Throughput: how much does it write, and how fast?")
    failures = db.Row("Failures: what goes wrong, and for whom?")
    snapshots = db.Row("Snapshots: initial loads and resyncs in progress")
    process = db.Row("Process: memory and CPU")
    builder = (
        db.Dashboard("cdc2ch: Delta Lake to ClickHouse replication")
        .uid(UID)
        .description(
            "Replication lag, throughput, batch latency, failures, snapshots and memory of `cdc2ch run "
            "--metrics-port`; one line per pipeline (variable `pipeline`)."
        )
        .tags(["cdc2ch", "clickhouse", "delta-lake"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(variable("instance", "Instance", "label_values(cdc2ch_rows_written_total, instance)"))
        .with_variable(
            variable(
                "pipeline",
                "Pipeline",
                'label_values(cdc2ch_rows_written_total{instance=~"$instance"}, pipeline)',
            )
        )
        # -- lag ------------------------------------------------------------------------------------
        .with_row(lag)
        .with_panel(
            worst(
                "Worst lag (seconds)",
                "The largest commit-time lag among the selected pipelines now (alert Cdc2chLagSeconds).",
                "s",
                f"max(cdc2ch_seconds_behind{{{PIPE}}})",
                "worst",
            )
        )  # fmt: skip
        .with_panel(
            worst(
                "Worst lag (versions)",
                "The most Delta versions not yet replicated by any selected pipeline (alert Cdc2chLagVersions).",
                "short",
                f"max(cdc2ch_versions_behind{{{PIPE}}})",
                "worst",
            )
        )  # fmt: skip
        .with_panel(
            worst(
                "Oldest last success",
                "Time since the selected pipeline that succeeded longest ago last ended a poll without error "
                "(alert Cdc2chNoSuccessfulPoll).",
                "s",
                f"max(time() - cdc2ch_last_success_timestamp_seconds{{{PIPE}}})",
                "oldest",
            )
        )  # fmt: skip
        .with_panel(
            worst(
                "Pipelines failing",
                "Selected pipelines whose last attempt failed (failures in a row > 0).",
                "short",
                f"count(cdc2ch_consecutive_failures{{{PIPE}}} > 0) or vector(0)",
                "failing",
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Seconds behind",
                "Commit time of the latest Delta version minus that of the last replicated one, per pipeline.",
                "s",
                query(f"cdc2ch_seconds_behind{{{PIPE}}}", "{{pipeline}}"),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Versions behind",
                "Delta versions not yet replicated, per pipeline.",
                "short",
                query(f"cdc2ch_versions_behind{{{PIPE}}}", "{{pipeline}}"),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Time since last success",
                "Seconds since each pipeline last ended a poll without error; it grows while a pipeline fails or "
                "one long catch-up or snapshot runs.",
                "s",
                query(f"time() - cdc2ch_last_success_timestamp_seconds{{{PIPE}}}", "{{pipeline}}"),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Committed and latest version",
                "The last Delta version committed to ClickHouse and the latest one in the Delta log.",
                "short",
                query(f"cdc2ch_committed_version{{{PIPE}}}", "{{pipeline}} committed"),
                query(f"cdc2ch_latest_version{{{PIPE}}}", "{{pipeline}} latest", "B"),
            )
        )  # fmt: skip
        # -- throughput -----------------------------------------------------------------------------
        .with_row(throughput)
        .with_panel(
            series(
                "Rows written per second",
                "Rows inserted into ClickHouse per second, per pipeline (snapshot rows excluded).",
                "rowsps",
                query(
                    f"sum by (pipeline) (rate(cdc2ch_rows_written_total{{{PIPE}}}[{RATE}]))", "{{pipeline}}"
                ),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Bytes and inserts per second",
                "Arrow bytes sent to ClickHouse per second, and insert statements per second, per pipeline.",
                "Bps",
                query(
                    f"sum by (pipeline) (rate(cdc2ch_bytes_written_total{{{PIPE}}}[{RATE}]))",
                    "{{pipeline}} bytes",
                ),
                query(
                    f"sum by (pipeline) (rate(cdc2ch_batches_written_total{{{PIPE}}}[{RATE}]))",
                    "{{pipeline}} inserts",
                    "B",
                ),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Insert latency (p50, p95, p99)",
                "Seconds per insert statement, from the cdc2ch_batch_seconds histogram, all selected pipelines.",
                "s",
                *[
                    query(
                        f"histogram_quantile({q}, sum by (le) ({BUCKETS}))",
                        f"p{round(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
                ],
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Insert latency p95 per pipeline",
                "The 95th percentile of seconds per insert, per pipeline; mean as a second line.",
                "s",
                query(
                    f"histogram_quantile(0.95, sum by (le, pipeline) ({BUCKETS}))",
                    "{{pipeline}} p95",
                ),
                query(
                    f"sum by (pipeline) (rate(cdc2ch_batch_seconds_sum{{{PIPE}}}[{RATE}])) / "
                    f"sum by (pipeline) (rate(cdc2ch_batch_seconds_count{{{PIPE}}}[{RATE}]))",
                    "{{pipeline}} mean",
                    "B",
                ),
            )
        )  # fmt: skip
        # -- failures -------------------------------------------------------------------------------
        .with_row(failures)
        .with_panel(
            series(
                "Errors by kind",
                "Failed attempts per interval, per pipeline and kind (source, clickhouse, config, state, "
                "schema_change, locked, other, internal).",
                "short",
                query(
                    f"sum by (pipeline, kind) (increase(cdc2ch_errors_total{{{PIPE}}}[{RATE}]))",
                    "{{pipeline}} {{kind}}",
                ),
                bars=True,
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Failures in a row",
                "Attempts that failed in a row, per pipeline (0 after a success; alert Cdc2chPipelineFailing at 3). "
                "Tables a --table pattern skips are counted apart.",
                "short",
                query(f"cdc2ch_consecutive_failures{{{PIPE}}}", "{{pipeline}}"),
                query(f"cdc2ch_tables_skipped{{{PROC}}}", "{{instance}} tables skipped", "B"),
            )
        )  # fmt: skip
        # -- snapshots ------------------------------------------------------------------------------
        .with_row(snapshots)
        .with_panel(
            series(
                "Snapshot progress",
                "Rows loaded by the running (or last) snapshot of each pipeline, as a share of the rows of its "
                "version.",
                "percentunit",
                query(
                    f"cdc2ch_snapshot_rows_loaded{{{PIPE}}} / cdc2ch_snapshot_rows_expected{{{PIPE}}}",
                    "{{pipeline}}",
                ),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "Snapshot running for",
                "How long the running snapshot of each pipeline has been loading; empty when none runs "
                "(alert Cdc2chSnapshotRunningLong at 2 h).",
                "s",
                query(f"time() - cdc2ch_snapshot_started_timestamp_seconds{{{PIPE}}}", "{{pipeline}}"),
            )
        )  # fmt: skip
        # -- process --------------------------------------------------------------------------------
        .with_row(process)
        .with_panel(
            series(
                "Resident memory",
                "Resident memory of the cdc2ch Python process and of the Spark JVM it started.",
                "bytes",
                query(f"process_resident_memory_bytes{{{PROC}}}", "{{instance}} python"),
                query(f"cdc2ch_jvm_process_resident_memory_bytes{{{PROC}}}", "{{instance}} jvm", "B"),
            )
        )  # fmt: skip
        .with_panel(
            series(
                "CPU",
                "CPU seconds per second of the Python process and of the Spark JVM.",
                "short",
                query(f"rate(process_cpu_seconds_total{{{PROC}}}[{RATE}])", "{{instance}} python"),
                query(
                    f"rate(cdc2ch_jvm_process_cpu_seconds_total{{{PROC}}}[{RATE}])", "{{instance}} jvm", "B"
                ),
            )
        )  # fmt: skip
    )
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel, rows' panels included."""
    out = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                out.append((inner["title"], target["expr"]))
    return out


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT} is not what {__file__} builds: run `python {__file__}`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(panel_queries(json.loads(text)))} queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
