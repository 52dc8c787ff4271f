"""The reference pages' tables, generated from the code's own declarations when the site is built: the click
commands and the option catalogue (commands, options, config keys, environment variables), the Prometheus
registry (metrics), the error classes (kinds and exit codes) and the type mapping.

A reference page holds a marker line `<!-- reference: NAME -->`; mkdocs calls `on_page_markdown` for each
page and the marker is replaced by the table NAME (see TABLES). tests/unit/test_docs.py checks that every
declared command, option, config key and metric reaches the built pages.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import click

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)


def _prose(text: str) -> str:
    """Help text as Markdown shows it: a `*` outside a code span is a character, not emphasis (a glob such
    as /lake/sales/* and orders_* lost both stars and came out in italics)."""
    return "".join(
        part if part.startswith("`") else part.replace("*", "\\*") for part in re.split(r"(`[^`]*`)", text)
    )


def _cell(text: object) -> str:
    """Text fit for one cell of a Markdown table."""
    return _prose(" ".join(str(text).split())).replace("|", "\\|").replace("<", "&lt;")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _value(param: click.Option) -> str:
    if param.is_flag:
        return ""
    if isinstance(param.type, click.Choice):
        return " " + "|".join(param.type.choices)
    return " " + (param.metavar or param.type.name.upper())


def _default(param: click.Option) -> str:
    default = param.default
    unset = default is None or default == () or callable(default) or type(default).__name__ == "Sentinel"
    return "" if param.is_flag or unset else f" Default: `{default}`."


def commands(group: click.Group | None = None) -> str:
    """Each command: its help, then its options in --help order under their --help headings, each with its
    value, environment variable, default and help."""
    from cdc2ch.cli import main
    from cdc2ch.commands.invocation.catalogue import CATALOGUE, GROUPS

    group = group or main
    heading = {(o.long_flag, c): o.group for o in CATALOGUE for c in o.commands}
    parts = []
    for name, command in group.commands.items():
        parts.append(f"## `cdc2ch {name}`\n\n{_prose(inspect.cleandoc(command.help or ''))}\n")
        options = [p for p in command.params if isinstance(p, click.Option) and p.opts[0] != "--help"]
        by_group: dict[str, list[str]] = {}
        for p in options:
            env = f" · `{p.envvar}`" if p.envvar else ""
            item = f"- **`{', '.join(p.opts)}{_value(p)}`**{env} — {_cell(p.help or '')}{_default(p)}"
            by_group.setdefault(heading.get((p.opts[0], name), ""), []).append(item)
        for title in sorted(by_group, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS)):
            parts.append((f"**{title}**\n\n" if title else "") + "\n".join(by_group[title]) + "\n")
    return "\n".join(parts)


def config_keys() -> str:
    """Every key a cdc2ch.toml may hold: where in the file, its flag and variable, the commands reading it."""
    from cdc2ch.commands.invocation.catalogue import CATALOGUE, COMMAND, PIPELINE, PROCESS, TABLE

    where = {
        PROCESS: "top level",
        PIPELINE: "top level or a `[[pipelines]]` entry",
        TABLE: "a `[[pipelines]]` entry (or the top level of a one-table file)",
    }
    keys: dict[str, list] = {}
    for o in CATALOGUE:
        if o.scope == COMMAND:
            continue
        entry = keys.setdefault(o.name, [o, set()])
        entry[1] |= o.commands
    rows = ["| key | where | flag | environment | commands | what it sets |", "|---|---|---|---|---|---|"]
    for name, (o, used_by) in sorted(keys.items()):
        env = "" if o.scope == TABLE else _code(o.env)
        rows.append(
            f"| `{name}` | {where[o.scope]} | `{o.long_flag}` | {env} | "
            f"{', '.join(f'`{c}`' for c in sorted(used_by))} | {_cell(o.help)} |"
        )
    return "\n".join(rows) + "\n"


def metrics() -> str:
    """Every metric the registry of a running pipeline exports, with its type, labels and meaning."""
    from prometheus_client import metrics as pm

    from cdc2ch.replication.metrics import Metrics

    found = Metrics()
    labels = {m._name: m._labelnames for m in vars(found).values() if isinstance(m, pm.MetricWrapperBase)}
    rows = ["| metric | type | labels | what it measures |", "|---|---|---|---|"]
    for family in sorted(found.registry.collect(), key=lambda f: f.name):
        suffix = "_total" if family.type == "counter" else ""
        names = ", ".join(f"`{n}`" for n in labels.get(family.name, ()))
        rows.append(f"| `{family.name}{suffix}` | {family.type} | {names} | {_cell(family.documentation)} |")
    return "\n".join(rows) + "\n"


def errors() -> str:
    """Each kind of error: its class, the `error_kind` label it counts under, its exit code and meaning."""
    from cdc2ch.replication.metrics import _KIND_OF, INTERNAL

    rows = ["| kind (`error_kind`) | error | exit code | what it means |", "|---|---|---|---|"]
    for cls, kind in _KIND_OF:
        rows.append(
            f"| `{kind}` | `{cls.__name__}` | {cls.exit_code} | {_cell((cls.__doc__ or '').split(chr(10))[0])} |"
        )
    rows.append(
        f"| `{INTERNAL}` | any other exception | 1 | A defect of cdc2ch: the message and a traceback. |"
    )
    return "\n".join(rows) + "\n"


SPARK_TYPES = (
    "boolean", "byte", "short", "integer", "long", "float", "double", "decimal(10,2)", "decimal(38,18)",
    "string", "char(3)", "varchar(20)", "binary", "date", "timestamp", "timestamp_ntz", "variant",
    {"type": "array", "elementType": "long", "containsNull": True},
    {"type": "map", "keyType": "string", "valueType": "double", "valueContainsNull": True},
    {"type": "struct", "fields": [
        {"name": "a", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "b", "type": "string", "nullable": True, "metadata": {}},
    ]},
)  # fmt: skip


def _spark_name(t) -> str:
    if isinstance(t, str):
        return t
    if t["type"] == "array":
        return f"array<{t['elementType']}>"
    if t["type"] == "map":
        return f"map<{t['keyType']},{t['valueType']}>"
    return "struct<" + ",".join(f"{f['name']}:{f['type']}" for f in t["fields"]) + ">"


def types() -> str:
    """The ClickHouse column type of each Spark type, as a non-key column (nullable) and as a key."""
    from cdc2ch.model.schema import clickhouse_type

    rows = ["| Spark (Delta) | ClickHouse | as a key column |", "|---|---|---|"]
    for t in SPARK_TYPES:
        rows.append(f"| `{_spark_name(t)}` | `{clickhouse_type(t, True)}` | `{clickhouse_type(t, False)}` |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "commands": commands,
    "config-keys": config_keys,
    "metrics": metrics,
    "errors": errors,
    "types": types,
}


def filled(markdown: str) -> str:
    """`markdown` with each marker replaced by its table."""
    return MARKER.sub(lambda m: TABLES[m.group(1)](), markdown)


def on_page_markdown(markdown: str, page, config, **kwargs) -> str:  # mkdocs hook
    results = RESULTS.get(page.file.src_uri)
    if results is not None:
        root = Path(config["config_file_path"]).parent
        markdown = markdown.rstrip() + "\n\n" + appended((root / results).read_text(encoding="utf-8"))
    return filled(markdown)


# What `make bench` writes (bench/workloads.py): its charts, images of the Benchmarks page, and its results
# with every full run's output, appended to the history page written by hand beside them.
CHARTS = {"img/results.png": "bench/results.png", "img/results-quick.png": "bench/results-quick.png"}
RESULTS = {"benchmark-history.md": "bench/results.md"}
APPENDED_TITLE = "## The output of each full run"


def appended(results: str) -> str:
    """bench/results.md as a section of a page: its title replaced, its other headings one level down (none
    inside a code block)."""
    out, fenced = [APPENDED_TITLE], False
    for line in results.splitlines()[1:]:
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if line.startswith("#") and not fenced else line)
    return "\n".join(out) + "\n"


def on_files(files, config, **kwargs):  # mkdocs hook
    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).parent
    for uri, source in CHARTS.items():
        files.append(File.generated(config, uri, abs_src_path=str(root / source)))
    return files
