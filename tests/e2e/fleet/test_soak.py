"""A one-minute soak (bench/soak.py) on every run of the suite: both targets, a writer committing all the
time, kills, signals and network faults at seeded moments, then an independent check of every table.

The seed is fixed so the suite replays the same schedule and writes; `make soak SEED=... MINUTES=...` runs
it longer or with another seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SEED = int(os.environ.get("CDC2CH_SOAK_SEED", "20261127"))
MINUTES = float(os.environ.get("CDC2CH_SOAK_MINUTES", "1"))


def test_a_short_soak_loses_and_doubles_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", str(MINUTES), "--seed", str(SEED),
         "--workdir", str(tmp_path / "soak")],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("PASS") == 2, done.stdout[-6000:]
