"""The shape of the code, checked: no import cycles, no oversized module, class, folder or signature, no two
modules or classes of one name, each rule in one module."""

from __future__ import annotations

import ast
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cdc2ch"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250
MAX_FOLDER_MODULES = 12
MAX_PARAMETERS = 8  # beyond, a signature carries a configuration: pass a value that names it


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The cdc2ch modules `name` imports anywhere in its body (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import mod` imports the module; `from mod import name` the module holding the name
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 20 and graph["cdc2ch.replication.pipeline"]
    assert cycles(graph) == []


# The packages by layer, lowest first: a module imports from its own layer and those below it, never above.
# The two sides (Delta and ClickHouse) share a layer and do not import each other.
LAYERS = [
    {"cdc2ch.base"},
    {"cdc2ch.model"},
    {"cdc2ch.source", "cdc2ch.clickhouse"},
    {"cdc2ch.replication"},
    {"cdc2ch.fleet"},
    {"cdc2ch.commands"},
    {"cdc2ch", "cdc2ch.api", "cdc2ch.cli", "cdc2ch.__main__"},
]
SIDES = {"cdc2ch.source", "cdc2ch.clickhouse"}


def layer_of(module: str) -> tuple[int, str]:
    """(the layer's index, the package) of a module."""
    for i, packages in enumerate(LAYERS):
        for package in sorted(packages, key=len, reverse=True):
            if module == package or (package != "cdc2ch" and module.startswith(package + ".")):
                return i, package
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")


def test_each_module_belongs_to_a_layer_and_the_top_level_holds_only_the_entry_points():
    top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert top == {"__init__.py", "__main__.py", "api.py", "cli.py", "base", "model", "source", "clickhouse",
                   "replication", "fleet", "commands"}  # fmt: skip
    for name in modules():
        layer_of(name)


def test_imports_flow_down_the_layers():
    upward = []
    for name, deps in import_graph().items():
        mine, package = layer_of(name)
        for dep in deps:
            theirs, other = layer_of(dep)
            if theirs > mine or (theirs == mine and other != package and package in SIDES):
                upward.append(f"{name} -> {dep}")
    assert upward == []


def test_the_layer_check_finds_an_upward_import():
    assert layer_of("cdc2ch.model.config")[0] < layer_of("cdc2ch.replication.pipeline")[0]
    assert layer_of("cdc2ch.clickhouse.state.statestore") == (2, "cdc2ch.clickhouse")
    assert layer_of("cdc2ch.cli") == (6, "cdc2ch.cli")


# The loop drives the ports it defines; only these modules wire the adapters (Delta, Spark, Sharing,
# ClickHouse) into them.
LOOP = ("cdc2ch.replication", "cdc2ch.fleet")
ADAPTERS = ("cdc2ch.source", "cdc2ch.clickhouse")
COMPOSITION = {"cdc2ch.replication.target", "cdc2ch.fleet.assembly"}


def adapter_imports(graph: dict[str, set[str]]) -> list[str]:
    """`module -> adapter` for each import of an adapter package by a loop module other than a composition one."""
    return sorted(
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if name.startswith(LOOP) and name not in COMPOSITION
        for dep in deps
        if dep.startswith(ADAPTERS)
    )


def test_the_loop_reaches_the_adapters_through_its_composition_modules_only():
    assert adapter_imports(import_graph()) == []


def test_the_adapter_rule_finds_a_loop_module_importing_an_adapter():
    graph = {"cdc2ch.replication.pipeline": {"cdc2ch.clickhouse.connection.transport", "cdc2ch.model.config"},
             "cdc2ch.replication.target": {"cdc2ch.clickhouse.state.lock"},
             "cdc2ch.commands.app": {"cdc2ch.source.spark.lazysession"}}  # fmt: skip
    assert adapter_imports(graph) == ["cdc2ch.replication.pipeline -> cdc2ch.clickhouse.connection.transport"]


def test_the_cli_hands_every_command_over_the_same_way():
    """cli.py declares commands only: each body is one call, app.<command>(_current())."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    commands = [
        f for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any(isinstance(d, ast.Call) and ast.unparse(d.func) == "main.command" for d in f.decorator_list)
    ]  # fmt: skip
    calls = {f.name: ast.unparse(f.body[-1]) for f in commands}
    assert len(calls) >= 12 and all(len(f.body) == 2 for f in commands)  # the docstring, the hand-over
    assert {n: c for n, c in calls.items() if not re.fullmatch(r"app\.\w+\(_current\(\)\)", c)} == {}


def test_every_package_says_what_it_decides():
    for name, path in modules().items():
        if path.name == "__init__.py" or "." not in name.removeprefix("cdc2ch."):
            assert ast.get_docstring(ast.parse(path.read_text())), name


def test_the_documents_the_code_cites_exist_with_the_sections_it_names():
    """A comment cites the design by its path and a section's title (docs/design.md, "The row contract")."""
    root = PACKAGE.parent
    cited = re.compile(r'(docs/[\w./-]+\.md)(?:, "([^"]+)")?')
    missing = []
    for name, path in modules().items():
        for doc, section in cited.findall(" ".join(path.read_text().split())):
            text = (root / doc).read_text() if (root / doc).exists() else None
            if text is None or (
                section and not re.search(rf"^#+ (\d+\. )?{re.escape(section)}$", text, re.M)
            ):
                missing.append((name, doc, section))
        assert not re.search(r"(?<!docs/)\bdesign\.md", path.read_text()), (
            f"{name} cites design.md without its path"
        )
    assert missing == []


def test_modules_log_through_cdc2ch_log():
    """cdc2ch.base.log.get_logger routes events to the caller's logging during Python API calls; a structlog
    logger taken directly would print on its own there."""
    direct = [
        name
        for name, path in modules().items()
        if name != "cdc2ch.base.log" and "structlog.get_logger(" in path.read_text()
    ]
    assert direct == []


def test_no_module_or_class_too_large():
    too_big = []
    for name, path in modules().items():
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            too_big.append(f"module {name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_big.append(f"class {name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_big == []


def twins(names: list[str]) -> list[tuple[str, str]]:
    """Pairs of names a reader would take for one another: the same, or one the other's plural."""
    seen: dict[str, str] = {}
    out = []
    for name in names:
        key = name.split(".")[-1].removesuffix("s")
        if key in seen:
            out.append((seen[key], name))
        seen.setdefault(key, name)
    return out


def test_the_twin_finder_finds_plurals_and_repeats():
    assert twins(["a.compaction", "b.compactions", "c.log", "d.log", "e.lock"]) == [
        ("a.compaction", "b.compactions"),
        ("c.log", "d.log"),
    ]


def test_no_two_modules_share_a_name():
    names = [name for name, path in modules().items() if path.stem not in ("__init__", "__main__")]
    assert twins(names) == []


def test_no_two_classes_share_a_name():
    classes = [
        f"{name}.{node.name}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    assert [pair for pair in twins(classes) if pair[0].split(".")[-1] == pair[1].split(".")[-1]] == []


def test_no_folder_holds_too_many_modules():
    """A folder past a dozen modules hides the seams between them: split it into packages along them."""
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if (p / "__init__.py").is_file())]:
        count = len([p for p in folder.glob("*.py") if p.stem != "__init__"])
        if count > MAX_FOLDER_MODULES:
            crowded[str(folder.relative_to(PACKAGE.parent))] = count
    assert crowded == {}


def test_no_function_takes_too_many_parameters():
    wide = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                given = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                count = len([p for p in given if p.arg not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    wide.append(f"{name}.{node.name} (line {node.lineno}): {count}")
    assert wide == []


# Shapes that would mean a rule written a second time outside the row contract.
RULE_SHAPES = {
    "the _version rule (version * 4 + rank)": re.compile(r"\*\s*\{?(4|SLOTS)\}?\s*\+"),
    "a rank value": re.compile(r"""["'](update_preimage|update_postimage|delete|insert)["']\s*[:,]\s*\d"""),
    "a deduplication-token format": re.compile(r"""f["'][^"'\n]*(:snap\{|:sweep\{|:p\{|\}-\{)"""),
    "the CDF column list": re.compile(r"""\(\s*["']_change_type["']\s*,\s*["']_commit_version["']"""),
}


def code(path: Path) -> str:
    """The module's text without comments and docstrings (which may describe a rule, not write it)."""
    out, previous = [], tokenize.NEWLINE
    with open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            docstring = tok.type == tokenize.STRING and previous in (
                tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING
            )  # fmt: skip
            if tok.type not in (tokenize.COMMENT, tokenize.NL) and not docstring:
                out.append(tok.string)
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                previous = tok.type
    return " ".join(out)


def test_each_rule_lives_in_the_row_contract_only():
    found = {what: [] for what in RULE_SHAPES}
    for name, path in modules().items():
        text = code(path)
        for what, shape in RULE_SHAPES.items():
            if shape.search(text):
                found[what].append(name)
    assert found == {what: ["cdc2ch.model.contract"] for what in RULE_SHAPES}
