"""The shell examples of a documentation page with what the page shows of each: a ```bash block, and the
```text block after it that holds the lines it prints on standard output (`…` stands for any text) and ends
with `(exit status N)`. Used by tests/e2e/commands/test_getting_started.py, which runs them, and by
tests/unit/test_docs.py, which checks that each example shows its exit status."""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
HEADING = re.compile(r"^(#{2,4}) (.+)$", re.M)
EXIT = re.compile(r"^\(exit status (\d+)\)$")


@dataclass(frozen=True)
class Example:
    section: str  # the heading the block is under
    script: str
    shown: tuple[str, ...]  # the output lines the page shows, without the exit status line
    exit_status: int | None  # None: the page shows none


def examples(markdown: str) -> list[Example]:
    """Each ```bash block of `markdown`, in order, with the output block that follows it (the next fenced
    block, when it is a ```text one)."""
    headings = [(m.start(), m.group(2)) for m in HEADING.finditer(markdown)]
    fences = list(FENCE.finditer(markdown))
    found = []
    for i, fence in enumerate(fences):
        if fence.group(1) != "bash":
            continue
        section = next((title for at, title in reversed(headings) if at < fence.start()), "")
        after = fences[i + 1] if i + 1 < len(fences) else None
        lines = after.group(2).splitlines() if after is not None and after.group(1) == "text" else []
        status = EXIT.match(lines[-1].strip()) if lines else None
        found.append(
            Example(
                section=section,
                script=fence.group(2),
                shown=tuple(lines[:-1]) if status else tuple(lines),
                exit_status=int(status.group(1)) if status else None,
            )
        )
    return found


def _pattern(line: str) -> re.Pattern[str]:
    words = " ".join(line.split())
    return re.compile(".*".join(re.escape(part) for part in words.split("…")))


def not_printed(shown: tuple[str, ...], printed: str) -> list[str]:
    """The lines of `shown` that no line of `printed` matches (spacing aside; `…` matches any text)."""
    lines = [" ".join(line.split()) for line in printed.splitlines()]
    return [s for s in shown if not any(_pattern(s).fullmatch(line) for line in lines)]


def disagreements(example: Example, returncode: int, stdout: str) -> list[str]:
    """How a run of `example` differs from what the page shows of it."""
    found = []
    if returncode != example.exit_status:
        found.append(f"exit status {returncode}, the page shows {example.exit_status}")
    found += [f"the page shows {line!r}, not printed" for line in not_printed(example.shown, stdout)]
    return found
