"""cdc2ch.base.retry: the one retry policy (attempts, capped backoff with jitter, Retry-After, what is retried,
the callback, and how Spark tasks take it along)."""

from __future__ import annotations

import ast
import inspect
import random
import subprocess
import sys

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from cdc2ch.base import retry
from cdc2ch.clickhouse import codes

pytestmark = pytest.mark.unit


class Flaky:
    """Fails with the given exceptions in turn, then returns "ok"."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.fixture
def seeded():
    """tenacity draws its jitter from `random`: seeded here, and put back afterwards."""
    state = random.getstate()
    random.seed(35)
    yield
    random.setstate(state)


def upper(attempt: int, base: float = 0.5, max_wait: float = 10.0) -> float:
    """The capped exponential backoff after failed attempt `attempt`: a wait lies in [upper/2, upper]."""
    return min(base * 2 ** (attempt - 1), max_wait)


def test_retries_until_success_with_exponential_backoff_and_jitter(seeded):
    fn, waits = Flaky(OSError("a"), OSError("b"), OSError("c")), []
    assert retry.call(fn, 5, lambda e: True, sleep=waits.append) == "ok"
    assert fn.calls == 4 and len(waits) == 3
    assert all(upper(n) / 2 <= w <= upper(n) for n, w in enumerate(waits, 1)), waits


def test_jitter_spreads_callers_that_fail_together(seeded):
    """Fifty callers failing at the same moment (a ClickHouse restart) do not retry in step: after each
    attempt their waits spread over the upper half of the backoff, the capped attempts included."""
    by_attempt = [[] for _ in range(7)]
    for _ in range(50):
        waits = []
        with pytest.raises(OSError):
            retry.call(Flaky(*[OSError()] * 8), 8, lambda e: True, base=1.0, max_wait=8.0, sleep=waits.append)
        for n, w in enumerate(waits):
            by_attempt[n].append(w)
    for n, waits in enumerate(by_attempt, 1):
        top = upper(n, 1.0, 8.0)
        assert all(top / 2 <= w <= top for w in waits), (n, waits)
        assert len(set(waits)) == 50  # no two callers wait alike
        assert max(waits) - min(waits) > top / 4  # spread over the half, not bunched
    assert max(max(w) for w in by_attempt) <= 8.0  # the cap holds


def test_the_same_seed_gives_the_same_waits():
    def waits_of(seed):
        random.seed(seed)
        waits = []
        retry.call(Flaky(*[OSError()] * 4), 5, lambda e: True, sleep=waits.append)
        return waits

    state = random.getstate()
    try:
        assert waits_of(7) == waits_of(7) != waits_of(8)
    finally:
        random.setstate(state)


def test_gives_up_after_the_attempts_with_the_last_error():
    fn, waits = Flaky(*[OSError(str(i)) for i in range(10)]), []
    with pytest.raises(OSError, match="^2$"):
        retry.call(fn, 3, lambda e: True, sleep=waits.append)
    assert fn.calls == 3 and len(waits) == 2  # no pause after the last attempt


@pytest.mark.parametrize("attempts", [0, 1, -3])
def test_at_least_one_attempt(attempts):
    fn = Flaky(OSError("x"))
    with pytest.raises(OSError):
        retry.call(fn, attempts, lambda e: True, sleep=lambda s: None)
    assert fn.calls == 1


def test_an_error_not_accepted_is_raised_at_once():
    fn, waits = Flaky(OSError("transient"), ValueError("permanent"), OSError("never")), []
    with pytest.raises(ValueError, match="permanent"):
        retry.call(fn, 10, lambda e: isinstance(e, OSError), sleep=waits.append)
    assert fn.calls == 2 and len(waits) == 1


@pytest.mark.parametrize("code", [codes.READONLY, codes.ACCESS_DENIED, codes.UNKNOWN_TABLE])
def test_a_permanent_refusal_is_tried_once_even_after_transient_faults(code):
    refusal = DatabaseError(f"Code: {code}. DB::Exception: refused", code=code)
    fn, waits = Flaky(OperationalError("connection reset"), refusal), []
    with pytest.raises(DatabaseError) as err:
        retry.call(fn, 10, codes.is_transient, sleep=waits.append)
    assert err.value is refusal and fn.calls == 2 and len(waits) == 1


def test_backoff_is_capped(seeded):
    fn, slept = Flaky(*[OSError()] * 40), []
    retry.call(fn, 41, lambda e: True, base=1.0, max_wait=3.0, sleep=slept.append)
    assert len(slept) == 40 and all(1.5 <= w <= 3.0 for w in slept[2:]) and max(slept) <= 3.0
    fn, slept = Flaky(*[OSError()] * 200), []
    retry.call(fn, 201, lambda e: True, sleep=slept.append)  # 2**199: no overflow, no huge sleep
    assert max(slept) <= 10.0


def test_a_retry_after_longer_than_the_backoff_is_honoured_up_to_the_cap(seeded):
    class Busy(OSError):
        def __init__(self, after):
            super().__init__("busy")
            self.retry_after = after

    hint = lambda e: getattr(e, "retry_after", None)  # noqa: E731
    fn, waits = Flaky(Busy(4.0), Busy(0.01), Busy(60.0), OSError("no hint")), []
    retry.call(fn, 5, lambda e: True, max_wait=10.0, sleep=waits.append, hint=hint)
    assert waits[0] == 4.0  # asked for more than the backoff
    assert upper(2) / 2 <= waits[1] <= upper(2)  # asked for less: the backoff stands
    assert waits[2] == 10.0  # never past the cap
    assert upper(4) / 2 <= waits[3] <= upper(4)


def test_on_retry_is_told_of_each_failed_attempt_before_the_pause():
    events = []
    first, second = OSError("1"), OSError("2")
    fn = Flaky(first, second)
    out = retry.call(
        fn,
        3,
        lambda e: True,
        on_retry=lambda attempt, exc, wait: events.append(("retry", attempt, exc, wait)),
        sleep=lambda s: events.append(("sleep", s)),
    )
    assert out == "ok"
    assert [e[:3] for e in events[::2]] == [("retry", 1, first), ("retry", 2, second)]
    assert [e[0] for e in events[1::2]] == ["sleep", "sleep"]
    assert [e[3] for e in events[::2]] == [e[1] for e in events[1::2]]  # told the pause it then takes


def test_on_retry_not_called_for_a_final_or_refused_failure():
    calls = []
    with pytest.raises(OSError):
        retry.call(Flaky(OSError()), 1, lambda e: True, on_retry=lambda *a: calls.append(a))
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()), 5, lambda e: False, on_retry=lambda *a: calls.append(a))
    assert calls == []


def test_base_exceptions_are_never_retried():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        retry.call(interrupted, 5, lambda e: True, sleep=lambda s: pytest.fail("slept"))


def test_standard_library_and_tenacity_only():
    tree = ast.parse(inspect.getsource(retry))
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "tenacity"}, imported


# Loads a pickled task where neither cdc2ch nor tenacity can be imported (an executor without them), runs it.
EXECUTOR = """
import pickle, sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cdc2ch", "tenacity"):
            raise ImportError(name + " is not installed here")

sys.meta_path.insert(0, Absent())
print(repr(pickle.loads(sys.stdin.buffer.read())()))
"""


def test_a_spark_task_takes_the_policy_and_tenacity_along_by_value():
    """What executors.py ships: retry.call pickled under shipped_by_value runs, retrying with
    jitter, in a Python where cdc2ch and tenacity are absent."""
    from pyspark import cloudpickle

    from cdc2ch.source.spark.session import shipped_by_value

    call = retry.call

    def task():  # as a Spark task closes over retry.call (self-contained: this module is not there either)
        calls, waits = [], []

        def flaky():
            calls.append(1)
            if len(calls) < 3:
                raise OSError("reset")
            return "ok"

        return call(flaky, 5, lambda e: True, sleep=waits.append, hint=lambda e: None), len(calls), len(waits)

    with shipped_by_value(retry):
        blob = cloudpickle.dumps(task)
    assert "tenacity" not in cloudpickle.list_registry_pickle_by_value()  # registered only meanwhile
    ran = subprocess.run([sys.executable, "-c", EXECUTOR], input=blob, capture_output=True, timeout=60)
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    assert ran.stdout.decode().strip() == "('ok', 3, 2)"
