"""Draws the panels of deploy/grafana/cdc2ch.json as a PNG, from a real Prometheus scraping a real cdc2ch: the
picture of the dashboard in docs/guides/monitoring.md (`make dashboard-picture`), where no Grafana can be
installed to render it.

    python deploy/grafana/picture.py docs/img/dashboard.png [--minutes 3]

It writes three small Delta tables with delta-rs, `orders` (a commit every second, a burst of versions half
way, a few deletes), `customers` (loaded by a snapshot through Spark, so the JVM's series show) and `broken`
(a directory that is no Delta table, so it fails again and again), starts `cdc2ch run --config ...
--metrics-port` on an embedded target and Prometheus (build/prometheus, `make prometheus`) scraping it every
second, then asks Prometheus each panel's queries over the run (`/api/v1/query_range`, with the dashboard's
variables set to every instance and pipeline) and draws each panel where the dashboard places it: a stat
panel's last value, a time series panel's lines with its legend.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = Path(__file__).with_name("cdc2ch.json")
PROMETHEUS = ROOT / "build" / "prometheus" / "root" / "usr" / "bin" / "prometheus"
SCRAPE_SECONDS = 1
STEP_SECONDS = 2
RATE_INTERVAL = "8s"  # Grafana's $__rate_interval for a 1 s scrape and a 2 s step would be 4 s; smoother here
CUSTOMERS = 100_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with {proc.returncode}")
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not seen in {timeout:.0f} s")
        time.sleep(0.5)


class Lake:
    """The Delta tables the service replicates, and the commits that keep arriving."""

    def __init__(self, root: Path):
        import pyarrow as pa
        from deltalake import write_deltalake

        self.pa, self.write = pa, write_deltalake
        self.orders, self.customers = str(root / "orders"), str(root / "customers")
        cdf = {"delta.enableChangeDataFeed": "true"}
        self.next_id = 0
        self.write(self.orders, self._orders(1000), configuration=cdf)
        ids = pa.array(range(CUSTOMERS), pa.int64())
        names = pa.array([f"customer {i}" for i in range(CUSTOMERS)])
        write_deltalake(self.customers, pa.table({"id": ids, "name": names}), configuration=cdf)
        (root / "broken").mkdir()

    def _orders(self, n: int):
        ids = self.pa.array(range(self.next_id, self.next_id + n), self.pa.int64())
        self.next_id += n
        return self.pa.table({"id": ids, "amount": self.pa.array([i % 997 / 10 for i in range(n)])})

    def keep_committing(self, stop: threading.Event, seconds: float) -> None:
        from deltalake import DeltaTable

        start = time.monotonic()
        burst = False
        while not stop.wait(1.0):
            elapsed = time.monotonic() - start
            if not burst and elapsed > seconds / 2:  # a backlog of versions arrives at once
                burst = True
                for _ in range(12):
                    self.write(self.orders, self._orders(50_000), mode="append")
                continue
            self.write(self.orders, self._orders(200 + int(elapsed) % 7 * 100), mode="append")
            if int(elapsed) % 15 == 0:
                DeltaTable(self.orders).delete(f"id < {int(elapsed) * 10}")


class Prometheus:
    def __init__(self, binary: Path, work: Path, target: str):
        self.port = free_port()
        config = work / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": f"{SCRAPE_SECONDS}s"},
                    "scrape_configs": [{"job_name": "cdc2ch", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        self.log = work / "prometheus.log"
        self.proc = subprocess.Popen(
            [str(binary), f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
        )  # fmt: skip

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=30).read())
        if body["status"] != "success":
            raise SystemExit(f"Prometheus refused {params}: {body}")
        return body["data"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def concrete(expr: str) -> str:
    """A panel's query with the dashboard's variables set: every instance, every pipeline."""
    return (
        expr.replace("$instance", ".*").replace("$pipeline", ".*").replace("$__rate_interval", RATE_INTERVAL)
    )


def legend(fmt: str, labels: dict) -> str:
    out = fmt
    for name, value in labels.items():
        out = out.replace("{{" + name + "}}", value)
    return out.replace("127.0.0.1:", ":")


def panels(board: dict) -> list[dict]:
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def collect(prom: Prometheus, board: dict, start: float, end: float) -> dict[str, list]:
    """Each panel's series over [start, end]: (legend, times, values)."""
    data: dict[str, list] = {}
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        series = []
        for target in panel.get("targets", []):
            result = prom.api(
                "query_range", query=concrete(target["expr"]), start=start, end=end, step=STEP_SECONDS
            )["result"]
            for s in result:
                times = [float(t) - start for t, _ in s["values"]]
                values = [float(v) for _, v in s["values"]]
                series.append((legend(target.get("legendFormat", ""), s["metric"]), times, values))
        data[panel["title"]] = series
    return data


UNITS = {"s": "s", "short": "", "rowsps": "rows/s", "Bps": "B/s", "bytes": "B", "percentunit": ""}


def scaled(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit in ("bytes", "Bps"):
        for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.1f} {name}{'/s' if unit == 'Bps' else ''}"
    if unit == "s" and value >= 120:
        return f"{value / 60:.1f} min"
    for size, name in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{name} {UNITS.get(unit, '')}".strip()
    return f"{value:.3g} {UNITS.get(unit, '')}".strip()


def draw(board: dict, data: dict[str, list], out: Path, caption: str) -> None:
    """Each panel where the dashboard's grid puts it (24 columns), over one time axis. In a panel of many
    series (every error kind is exported from the start), those at 0 throughout are drawn but left out of
    its legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    unit, gap, width = 0.32, 0.04, 16.0  # inches
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels(board))
    height = bottom * unit + 0.5
    fig = plt.figure(figsize=(width, height), facecolor="#111217")
    span = max((times[-1] for series in data.values() for _, times, _ in series if times), default=1.0)

    def frac(left: float, top: float, w: float, h: float) -> list[float]:  # inches from the top left
        return [left / width, 1 - (top + h) / height, w / width, h / height]

    for panel in panels(board):
        grid, title = panel["gridPos"], panel.get("title", "")
        left, top = grid["x"] / 24 * width + gap, grid["y"] * unit + gap
        w, h = grid["w"] / 24 * width - 2 * gap, grid["h"] * unit - 2 * gap
        if panel["type"] == "row":
            fig.text(
                left / width, 1 - (top + h * 0.8) / height, title, color="#ccccdc", fontsize=12, weight="bold"
            )
            continue
        fig.add_artist(
            Rectangle(frac(left, top, w, h)[:2], w / width, h / height, transform=fig.transFigure,
                      facecolor="#181b1f", edgecolor="#2c3036", zorder=-1)
        )  # fmt: skip
        fig.text(
            (left + 0.1) / width, 1 - (top + 0.08) / height, title, color="#ccccdc", fontsize=9.5, va="top"
        )
        fmt = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = data.get(title, [])
        if panel["type"] == "stat":
            last = max((s[2][-1] for s in series if s[2]), default=None)
            fig.text((left + w / 2) / width, 1 - (top + h * 0.6) / height,
                     "No data" if last is None else scaled(last, fmt), color="#73bf69", fontsize=24,
                     ha="center", va="center")  # fmt: skip
            continue
        ax = fig.add_axes(frac(left + 0.75, top + 0.32, w - 0.9, h - 0.62), facecolor="#181b1f")
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(colors="#8e8e9a", labelsize=7, length=0)
        if not series:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, "No data", color="#8e8e9a", ha="center", va="center", transform=ax.transAxes)
            continue
        for name, times, values in series:
            ax.plot(times, values, linewidth=1.3, label=name if any(values) or len(series) <= 6 else "_")
        ax.set_xlim(0, span)
        ax.grid(color="#2c3036", linewidth=0.6)
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, fmt=fmt: scaled(v, fmt)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0f} s"))
        if any(line.get_label() != "_" for line in ax.get_lines()):
            ax.legend(fontsize=7, loc="upper left", frameon=False, labelcolor="#ccccdc", ncol=3)
    fig.text(gap / width, 0.3 / height, caption, color="#8e8e9a", fontsize=8, va="center", wrap=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long commits keep arriving")
    parser.add_argument("--data", type=Path, help="also keep the panels' series and caption here (JSON)")
    parser.add_argument("--redraw", type=Path, help="draw from series kept by --data, running nothing")
    args = parser.parse_args(argv)
    board = json.loads(DASHBOARD.read_text())
    if args.redraw:
        kept = json.loads(args.redraw.read_text())
        draw(board, kept["series"], args.out, kept["caption"])
        return 0
    binary = PROMETHEUS if PROMETHEUS.is_file() else Path(shutil.which("prometheus") or "")
    if not binary.is_file():
        raise SystemExit("No Prometheus in build/prometheus nor on PATH: run `make prometheus` first.")
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="cdc2ch-dashboard-") as tmp:
        work = Path(tmp)
        lake = Lake(work)
        config = work / "cdc2ch.toml"
        config.write_text(
            f'clickhouse = "chdb://{work / "clickhouse"}"\npoll-interval = 1\nspark-master = "local[2]"\n'
            f'[[pipelines]]\nname = "orders"\ntable = "{lake.orders}"\nprimary-key = "id"\n'
            'target = "shop.orders"\nreader = "auto"\n'
            f'[[pipelines]]\nname = "customers"\ntable = "{lake.customers}"\nprimary-key = "id"\n'
            'target = "shop.customers"\ninitial-load = "snapshot"\nreader = "spark"\n'
            f'[[pipelines]]\nname = "broken"\ntable = "{work / "broken"}"\nprimary-key = "id"\n'
            'target = "shop.broken"\n'
        )
        port = free_port()
        log = (work / "cdc2ch.log").open("w")
        service = subprocess.Popen(
            [sys.executable, "-m", "cdc2ch", "run", "--config", str(config), "--metrics-port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CDC2CH_HOME": str(work / "home")},
        )  # fmt: skip
        prom = Prometheus(binary, work, f"127.0.0.1:{port}")
        stop = threading.Event()
        try:
            wait_for("cdc2ch's metrics", lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics"), 120,
                     service)  # fmt: skip
            wait_for("Prometheus", lambda: prom.api("query", query="up")["result"], 60, prom.proc)
            start = time.time()
            writer = threading.Thread(target=lake.keep_committing, args=(stop, seconds), daemon=True)
            writer.start()
            print(f"commits arriving for {seconds:.0f} s; cdc2ch on :{port}, Prometheus on :{prom.port}")
            wait_for("the end of the run", lambda: time.time() - start >= seconds, seconds + 60, service)
            stop.set()
            writer.join(60)
            time.sleep(5 * SCRAPE_SECONDS)  # the last commits replicated and scraped
            data = collect(prom, board, start, time.time())
        finally:
            stop.set()
            service.send_signal(signal.SIGTERM)
            service.wait(120)
            prom.stop()
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.split(
            "\n"
        )[0]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    caption = (
        f"deploy/grafana/cdc2ch.json, each panel's queries answered by a real Prometheus ({version.strip()}) "
        f"scraping cdc2ch run --config every {SCRAPE_SECONDS} s while commits arrived for {seconds:.0f} s "
        f"({stamp}; drawn by deploy/grafana/picture.py, not by Grafana; in a panel of many series, those at 0 "
        f"throughout are left out of its legend)."
    )
    if args.data:
        args.data.write_text(json.dumps({"series": data, "caption": caption}))
    draw(board, data, args.out, caption)
    empty = [title for title, series in data.items() if not series]
    print(f"wrote {args.out}; panels without data: {empty or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
