"""cdc2ch's one retry policy: a bounded number of attempts, capped exponential backoff with jitter, on tenacity.

Standard library and tenacity only, and no other cdc2ch module, so that a Spark task can take it along by
value (cloudpickle, tenacity with it: see SHIPS_WITH) and retry exactly as the driver does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import tenacity
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.wait import wait_base

T = TypeVar("T")

# What a Spark task needs by value beside this module, where neither cdc2ch nor tenacity is installed.
SHIPS_WITH = (tenacity,)


def attempts(n: int) -> str:
    """`n` attempts, in words: "1 attempt", "5 attempts"."""
    return f"{n} attempt" if n == 1 else f"{n} attempts"


def jittered(base: float = 0.5, max_wait: float = 10.0) -> wait_base:
    """The pause after failed attempt n: half of the capped backoff b = min(base * 2**(n-1), max_wait), plus a
    random share of the other half ("equal jitter"), so many callers failing together do not retry in step,
    yet none waits less than b/2."""
    half, cap = base / 2, max_wait / 2
    return wait_exponential(multiplier=half, max=cap) + wait_random_exponential(multiplier=half, max=cap)


class honour_retry_after(wait_base):  # named as tenacity names its waits
    """`inner`'s pause, or the wait the other side asked for (an HTTP Retry-After, read off the exception by
    `hint`) when longer; never more than `max_wait`."""

    def __init__(self, inner: wait_base, hint: Callable[[BaseException], float | None], max_wait: float):
        self.inner, self.hint, self.max_wait = inner, hint, max_wait

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = self.inner(retry_state)
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        asked = self.hint(exc) if exc is not None else None
        return wait if asked is None else min(max(wait, asked), self.max_wait)


def call(
    fn: Callable[[], T],
    attempts: int,
    retry_if: Callable[[BaseException], bool],
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    base: float = 0.5,
    max_wait: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    hint: Callable[[BaseException], float | None] | None = None,
) -> T:
    """Call `fn` up to `attempts` times (at least once) while it raises an exception `retry_if` accepts.

    Before each new attempt, `on_retry(attempt, exception, wait)` is told of the failed attempt and the
    pause that follows it (see `jittered`). `hint(exception)` may give the wait the other side asked for
    (an HTTP Retry-After): it is honoured up to `max_wait`, never shorter than the backoff. The last
    exception, or the first one `retry_if` refuses, propagates unchanged; a BaseException that is not an
    Exception (KeyboardInterrupt, SystemExit) is never retried.
    """
    wait = jittered(base, max_wait)
    if hint is not None:
        wait = honour_retry_after(wait, hint, max_wait)

    def before_sleep(state: RetryCallState) -> None:  # after a failed attempt, when on_retry is given
        exc = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and exc is not None:
            on_retry(state.attempt_number, exc, state.upcoming_sleep)

    return Retrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait,
        retry=retry_if_exception(lambda exc: isinstance(exc, Exception) and retry_if(exc)),
        before_sleep=before_sleep if on_retry is not None else None,
        sleep=sleep,
        reraise=True,
    )(fn)
