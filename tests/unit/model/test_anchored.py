"""Where a pipeline reads never depends on where the process stands later: a configuration's local paths are
made absolute once, and statements that must run from / do not move the process under one another."""

from __future__ import annotations

import os
import threading

import pytest

from cdc2ch.clickhouse.connection.fileroot import _FromRoot
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.tableref import anchored, is_local

pytestmark = pytest.mark.unit


def test_local_paths_patterns_and_profiles_are_anchored_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert anchored("lake/orders/") == f"{tmp_path}/lake/orders"
    assert anchored("./lake/*") == f"{tmp_path}/lake/*"
    assert anchored("file:///lake/orders") == "/lake/orders"
    assert anchored("p.share#sales.eu.orders") == f"{tmp_path}/p.share#sales.eu.orders"
    for other in ("sales.orders", "main.sales.orders_*", "s3a://lake/orders", "", "   "):
        assert anchored(other) == other
    cfg = RunConfig(table="lake/orders", primary_key=("id",), target=TargetName("db", "t"), clickhouse_dsn="x",
                    pipeline="db.t")  # fmt: skip
    monkeypatch.chdir("/")
    assert cfg.table == f"{tmp_path}/lake/orders"  # decided when the configuration was built


def test_overlapping_statements_from_root_move_back_once_the_last_ends(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from_root = _FromRoot()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []

    def first() -> None:
        with from_root():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with from_root():
        second_in.set()
        first_out.wait(5)
        seen.append(os.getcwd())  # the first has ended; this one still runs from /
    thread.join(5)
    assert seen == ["/"] and os.getcwd() == str(tmp_path)


def test_a_location_is_local_with_no_scheme_or_a_file_scheme():
    for local in ("/lake/orders", "lake/orders", "./t", "~/t", "file:/lake/orders", "file:///lake/t"):
        assert is_local(local), local
    for remote in ("s3a://bucket/orders", "s3://b/t", "abfss://c@a.dfs.core.windows.net/t", "https://h/t"):
        assert not is_local(remote), remote
