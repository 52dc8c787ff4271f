"""Every command that addresses pipelines or their database finds them the same way: --config (or
CDC2CH_CONFIG) names the file, whose `clickhouse` and pipelines it resolves as `run` does (issue 68, item 2)."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.cli import invocation, main
from cdc2ch.commands.invocation.listing import clickhouse_of, compact_targets
from cdc2ch.model.config import TargetName

pytestmark = pytest.mark.unit

FILE_URL = "http://reader@ch.example:8123/"
# Each command addressing pipelines or their database, with the arguments it needs besides --config.
ADDRESSING = {
    "run": [],
    "validate": [],
    "snapshot": [],
    "reshape": [],
    "verify": [],
    "status": [],
    "query": ["SELECT 1"],
    "compact": [],
    "pause": ["--pipeline", "orders"],
    "resume": ["--pipeline", "orders"],
    "resync": ["--pipeline", "orders"],
}


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "cdc2ch.toml"
    path.write_text(
        f'clickhouse = "{FILE_URL}"\n'
        f'[[pipelines]]\ntable = "{tmp_path}/orders"\nprimary-key = "id"\ntarget = "sales.orders"\n'
        f'[[pipelines]]\nname = "items"\ntable = "{tmp_path}/items"\nprimary-key = "id"\n'
    )
    return str(path)


def _invocation(command: str, *args: str):
    ctx = main.commands[command].make_context(command, [*ADDRESSING[command], *args])
    return invocation(ctx)


@pytest.mark.parametrize("command", sorted(ADDRESSING))
def test_every_command_addressing_pipelines_takes_the_config_file_and_its_clickhouse(
    command, config, monkeypatch
):
    monkeypatch.delenv("CDC2CH_CLICKHOUSE_URL", raising=False)
    assert clickhouse_of(_invocation(command, "--config", config)) == FILE_URL
    monkeypatch.setenv("CDC2CH_CONFIG", config)  # the variable, as every option has one
    assert clickhouse_of(_invocation(command)) == FILE_URL
    # a flag (or its variable) wins over the file, as for `run`
    assert clickhouse_of(_invocation(command, "--clickhouse", "chdb:///elsewhere")) == "chdb:///elsewhere"
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_URL", "chdb:///from-env")
    assert clickhouse_of(_invocation(command)) == "chdb:///from-env"


def test_compact_names_its_table_by_target_pipeline_or_config(config):
    targets = compact_targets
    assert targets(_invocation("compact", "--target", "a.b")) == [TargetName("a", "b")]
    assert targets(_invocation("compact", "--config", config)) == [
        TargetName("sales", "orders"),
        TargetName("cdc2ch", "items"),
    ]
    assert targets(_invocation("compact", "--config", config, "--pipeline", "items")) == [
        TargetName("cdc2ch", "items")
    ]
    assert targets(_invocation("compact", "--pipeline", "items")) is None  # found in ClickHouse by name
    with pytest.raises(
        ConfigError, match="--pipeline 'nope' is not in .*; its pipelines are: sales.orders, items"
    ):
        targets(_invocation("compact", "--config", config, "--pipeline", "nope"))
    with pytest.raises(ConfigError, match="compact needs to know which table"):
        targets(_invocation("compact"))
    with pytest.raises(ConfigError, match="give one of them"):
        targets(_invocation("compact", "--target", "a.b", "--pipeline", "items"))


def test_status_reads_its_config_file_once(config, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from cdc2ch.model.config import ConfigFile

    loads, load = [], ConfigFile.load.__func__  # type: ignore[attr-defined]

    def counted(cls, *args):
        loads.append(args[0])
        return load(cls, *args)

    monkeypatch.setattr(ConfigFile, "load", classmethod(counted))
    nowhere = f"chdb://{tmp_path / 'nowhere'}"  # ends the command once the file has been read
    result = CliRunner().invoke(main, ["status", "--config", config, "--clickhouse", nowhere])
    assert result.exit_code != 0 and "nowhere" in result.output, result.output
    assert loads == [config]  # before: the file was read for the options, then again for its pipelines


def test_a_plain_entry_of_the_file_is_found_without_listing_the_patterns(tmp_path, capsys, monkeypatch):
    """pause, resume, resync and compact name one pipeline: an entry of that name is the answer, and the
    file's patterns (a listing of storage or a catalog, maybe Spark's start) are listed only for another,
    without a line of their own (the command says what it did)."""
    from cdc2ch.base import log
    from cdc2ch.commands.invocation.listing import Known, file_pipelines
    from cdc2ch.fleet import discovery

    listed: list[str] = []
    expand = discovery.expand
    monkeypatch.setattr(
        discovery, "expand", lambda values, *a: listed.append(values["table"]) or expand(values, *a)
    )
    (tmp_path / "lake").mkdir()
    path = tmp_path / "cdc2ch.toml"
    path.write_text(
        f'[[pipelines]]\nname = "orders"\ntable = "{tmp_path}/orders"\nprimary-key = "id"\n'
        f'target = "sales.orders"\n'
        f'[[pipelines]]\ntable = "{tmp_path}/lake/*"\nprimary-key = "id"\ntarget = "sales.{{table}}"\n'
    )
    orders = [Known("orders", TargetName("sales", "orders"))]
    try:
        log.configure("console")  # onto capsys's stream
        capsys.readouterr()
        assert file_pipelines(_invocation("pause", "--config", str(path)), named="orders") == orders
        assert compact_targets(_invocation("compact", "--config", str(path), "--pipeline", "orders")) == [
            TargetName("sales", "orders")
        ]
        assert listed == []  # before: listed for each
        assert file_pipelines(_invocation("pause", "--config", str(path)), named="sales.items") == orders
        assert listed == [f"{tmp_path}/lake/*"]  # another name: the patterns are listed
        assert "pattern_listed" not in capsys.readouterr().err  # quietly
    finally:
        with capsys.disabled():
            log.configure("console")
