"""cdc2ch.base.retry: the one retry policy (attempts, capped backoff, what is retried, the callback)."""

from __future__ import annotations

import ast
import inspect
import sys

import pytest

from cdc2ch.base import retry

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


def test_retries_until_success_with_exponential_backoff():
    fn, waits = Flaky(OSError("a"), OSError("b"), OSError("c")), []
    assert retry.call(fn, 5, lambda e: True, sleep=waits.append) == "ok"
    assert fn.calls == 4 and waits == [0.5, 1.0, 2.0]


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
    assert fn.calls == 2 and waits == [0.5]


def test_backoff_is_bounded():
    waits = [retry.backoff(a, base=0.5, max_wait=10.0) for a in range(1, 12)]
    assert waits[:5] == [0.5, 1.0, 2.0, 4.0, 8.0] and set(waits[5:]) == {10.0}
    assert retry.backoff(200) == 10.0  # no overflow, no huge sleep
    fn, slept = Flaky(*[OSError()] * 7), []
    retry.call(fn, 8, lambda e: True, base=1.0, max_wait=3.0, sleep=slept.append)
    assert slept == [1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]


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
    assert events == [("retry", 1, first, 0.5), ("sleep", 0.5), ("retry", 2, second, 1.0), ("sleep", 1.0)]


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


def test_standard_library_only_so_spark_tasks_can_take_it_by_value():
    tree = ast.parse(inspect.getsource(retry))
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
