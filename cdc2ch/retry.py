"""Placeholder until the ClickHouse-side branch lands its retry policy."""

from __future__ import annotations

import time


def call(fn, attempts, retry_if, on_retry=None, base=0.5, max_wait=10.0, sleep=time.sleep):
    for attempt in range(1, max(1, attempts) + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt >= attempts or not retry_if(exc):
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(min(base * 2 ** (attempt - 1), max_wait))
