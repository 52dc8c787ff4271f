"""The score of `make mutants`, from mutmut's results (`mutmut results --all true`, after `mutmut run`).

Prints the mutants counted by outcome, the score killed / (total - listed equivalent), and every mutant that was
not killed: each either listed in tests/mutants-equivalent.txt (`<mutant name>  <reason>`, one a line) or not.
Exits non-zero when the score is under 90%, when a mutant that was not killed is not listed, or when the list
names a mutant that mutmut no longer makes or that the tests kill (the list is stale: the code moved).

A mutant the tests detect by failing, by running out of time or by crashing the test process counts as killed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT = ROOT / "tests" / "mutants-equivalent.txt"
THRESHOLD = 0.90
KILLED = ("killed", "timeout", "segfault", "caught by type check")  # the tests told the mutant apart
RESULT = re.compile(r"^\s+(\S+): (.+)$")


def results() -> dict[str, str]:
    """Mutant name -> mutmut's status, for every mutant of the last run."""
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run(
        [str(mutmut), "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {m.group(1): m.group(2).strip() for line in out.splitlines() if (m := RESULT.match(line))}


def listed(path: Path | None = None) -> dict[str, str]:
    """Mutant name -> why it is equivalent; blank lines and # comments are skipped."""
    path = path or EQUIVALENT
    out: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, reason = line.strip().partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path.name}:{number}: {name} has no reason")
        if name in out:
            raise SystemExit(f"{path.name}:{number}: {name} is listed twice")
        out[name] = reason.strip()
    return out


def main() -> int:
    statuses = results()
    if not statuses:
        print("No mutmut results: run `mutmut run` first (make mutants).")
        return 2
    equivalent = listed()
    counts = Counter(statuses.values())
    total = len(statuses)
    killed = sum(counts[s] for s in KILLED)
    survivors = sorted(n for n, s in statuses.items() if s not in KILLED)
    listed_equivalent = [n for n in survivors if n in equivalent]
    unlisted = [n for n in survivors if n not in equivalent]
    stale = sorted(n for n in equivalent if statuses.get(n) is None or statuses[n] in KILLED)
    considered = total - len(listed_equivalent)
    score = killed / considered if considered else 1.0

    others = {s: c for s, c in sorted(counts.items()) if s not in (*KILLED, "survived", "no tests")}
    print(
        f"mutants: {total} total, {killed} killed, {len(survivors)} survived "
        f"({len(listed_equivalent)} of them equivalent, listed in {EQUIVALENT.name}); "
        f"of the killed, {counts['timeout']} by timeout and {counts['segfault']} by a crash; "
        f"of the survivors, {counts['no tests']} reached by no unit test"
        + "".join(f", {c} {s}" for s, c in others.items())
    )
    print(f"score: {killed} / ({total} - {len(listed_equivalent)}) = {score:.1%} (at least {THRESHOLD:.0%})")
    print()
    print(f"surviving mutants ({len(survivors)}):")
    for name in survivors:
        why = f"equivalent: {equivalent[name]}" if name in equivalent else "NOT LISTED: kill it or list it"
        print(f"  {name}  [{statuses[name]}]  {why}")

    failed = False
    if unlisted:
        failed = True
        print(
            f"\n{len(unlisted)} surviving mutant(s) neither killed nor listed; `mutmut show <name>` shows each:"
        )
        for name in unlisted:
            print(f"  {name}")
    if stale:
        failed = True
        print(
            f"\n{len(stale)} listed mutant(s) that this run did not leave alive (killed, or no longer made):"
        )
        for name in stale:
            print(f"  {name}  [{statuses.get(name, 'not made')}]")
    if score < THRESHOLD:
        failed = True
        print(f"\nscore {score:.1%} is under {THRESHOLD:.0%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
