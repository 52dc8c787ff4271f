"""The documentation site (mkdocs.yml, docs/): it builds with --strict (no broken link or anchor), its
reference holds every command, option, environment variable, config key, metric and error kind the code
declares, and the README stays a short page whose links lead into the site."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cdc2ch.cli import main
from cdc2ch.commands.invocation.catalogue import CATALOGUE, COMMAND
from tests.support.doc_examples import Example, disagreements, examples

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"


def _reference():
    spec = importlib.util.spec_from_file_location("reference", REPO / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def _page(site: Path, name: str) -> str:
    return (site / "reference" / name / "index.html").read_text(encoding="utf-8")


def missing_from_commands(group: click.Group, markdown: str) -> list[str]:
    """The commands and (command, option, variable) of `group` that the commands page `markdown` lacks."""
    sections = dict(re.findall(r"^## `cdc2ch ([a-z-]+)`\n(.*?)(?=^## |\Z)", markdown, re.S | re.M))
    lost = [f"command {name}" for name in group.commands if name not in sections]
    for name, command in group.commands.items():
        for p in command.params:
            if isinstance(p, click.Option) and p.opts[0] != "--help":
                text = sections.get(name, "")
                lost += [f"{name} {flag}" for flag in p.opts if f"{flag}" not in text]
                if p.envvar and f"`{p.envvar}`" not in text:
                    lost.append(f"{name} {p.envvar}")
    return lost


def test_the_commands_page_lists_every_command_option_and_variable():
    assert missing_from_commands(main, reference.commands()) == []


def test_an_option_missing_from_the_generators_input_is_caught():
    """Generated from a command that lost an option, the page no longer holds what the code declares."""
    query = main.commands["query"]
    trimmed = click.Command("query", params=[p for p in query.params if p.name != "config_path"])
    shorter = click.Group(commands={**main.commands, "query": trimmed})
    assert missing_from_commands(main, reference.commands(shorter)) == [
        "query --config",
        "query CDC2CH_CONFIG",
    ]


def test_the_built_reference_holds_every_declaration(site):
    from cdc2ch.replication.metrics import ERROR_KINDS, Metrics

    commands, keys = _page(site, "commands"), _page(site, "config-keys")
    metrics, errors = _page(site, "metrics"), _page(site, "errors")
    assert "<!-- reference:" not in commands + keys + metrics + errors
    # Help texts are plain text: a glob's stars (/lake/sales/*, local[*]) stay characters, never emphasis.
    assert "<em>" not in commands + keys + metrics + errors
    assert "/lake/sales/*, sales.orders_*" in commands and "local[*]" in keys
    assert [n for n in main.commands if f"cdc2ch {n}" not in commands] == []
    flags = {
        f for c in main.commands.values() for p in c.params if isinstance(p, click.Option) for f in p.opts
    }
    assert sorted(f for f in flags - {"--help"} if f not in commands) == []
    configurable = {o.name: o for o in CATALOGUE if o.scope != COMMAND}
    assert sorted(k for k in configurable if f"<code>{k}</code>" not in keys) == []
    declared = {f.name for f in Metrics().registry.collect()}
    assert sorted(m for m in declared if f"<code>{m}" not in metrics) == []
    assert sorted(k for k in ERROR_KINDS if f"<code>{k}</code>" not in errors) == []


def test_the_readme_is_short_and_its_links_lead_into_the_site(site):
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert len(links) > 20
    for path, anchor in links:
        assert (REPO / path).is_file(), path
        page = path.removeprefix("docs/").removesuffix(".md")
        html = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert not anchor or f'id="{anchor}"' in html.read_text(encoding="utf-8"), f"{path}#{anchor}"


def _shell_blocks(text: str, heading: str) -> str:
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{2,4} ", section, maxsplit=1)[0]
    return "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))


def test_the_readmes_walkthrough_is_the_getting_started_one():
    """The README's five minutes are the site's "Your own table", word for word in their commands
    (tests/e2e/commands/test_getting_started.py runs them)."""
    ours = _shell_blocks(README.read_text(encoding="utf-8"), "### Your own table")
    site = _shell_blocks(GETTING_STARTED.read_text(encoding="utf-8"), "## Your own table")
    assert ours and ours == site


def test_each_shell_example_of_getting_started_shows_its_exit_status():
    """tests/e2e/commands/test_getting_started.py runs each block and holds it to what the page shows."""
    found = examples(GETTING_STARTED.read_text(encoding="utf-8"))
    assert [e.script for e in found if e.exit_status is None] == []
    sections = [e.section for e in found]
    assert {"Install and the demo", "Your own table", "The first service"} <= set(sections), sections
    service = next(e for e in found if e.section == "The first service")
    assert "--serve" in service.script and "cdc2ch status" in service.script and "kill %1" in service.script


PAGE = """## Run it

```bash
cdc2ch run --once
```

Prose between.

```text
cdc2ch.orders: versions 0..2 replicated, 3 rows written, in …s
(exit status 0)
```

```bash
cdc2ch status
```
"""


def test_an_example_is_held_to_its_exit_status_and_its_shown_lines():
    run, status = examples(PAGE)
    assert run == Example(
        "Run it",
        "cdc2ch run --once\n",
        ("cdc2ch.orders: versions 0..2 replicated, 3 rows written, in …s",),
        0,
    )
    assert status.exit_status is None and status.shown == ()
    printed = "cdc2ch.orders:  versions 0..2 replicated, 3 rows written, in 58.2s\n"
    assert disagreements(run, 0, printed) == []
    assert disagreements(run, 2, printed) == ["exit status 2, the page shows 0"]
    assert disagreements(run, 0, "cdc2ch.orders: versions 0..1 replicated, 2 rows written, in 1.0s") == [
        "the page shows 'cdc2ch.orders: versions 0..2 replicated, 3 rows written, in …s', not printed"
    ]
