"""source/threads.RowQueue: what a streamed Spark read holds for inserts that lag behind its scan."""

from __future__ import annotations

import threading

import pytest

from cdc2ch.source.threads import RowQueue

pytestmark = pytest.mark.unit


def _producer(queue: RowQueue, batches: list[int], accepted: list[int]) -> threading.Thread:
    def run() -> None:
        for i, rows in enumerate(batches):
            queue.put(i, rows)
            accepted.append(i)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_producer_waits_once_the_limit_would_be_passed_and_goes_on_as_rows_are_taken():
    queue, accepted = RowQueue(250), []
    producer = _producer(queue, [100] * 5, accepted)
    producer.join(0.3)
    assert producer.is_alive() and accepted == [0, 1]  # a third batch would hold 300 rows
    assert queue.get() == 0
    producer.join(0.3)
    assert accepted == [0, 1, 2]  # 200 wait again
    assert [queue.get() for _ in range(4)] == [1, 2, 3, 4]
    producer.join(1)
    assert not producer.is_alive()


def test_a_batch_larger_than_the_limit_is_let_in_alone_and_the_end_of_a_stream_always_is():
    queue, accepted = RowQueue(50), []
    producer = _producer(queue, [80, 10], accepted)
    producer.join(0.3)
    assert accepted == [0]  # one batch whatever its size; the next waits for it to be taken
    queue.put("end")  # no rows: never waits
    assert queue.get() == 0 and queue.get() == "end"
    producer.join(1)
    assert accepted == [0, 1] and queue.get() == 1


def test_close_lets_a_waiting_producer_go_and_drops_what_it_puts():
    queue, accepted = RowQueue(100), []
    producer = _producer(queue, [100, 100, 100], accepted)
    producer.join(0.3)
    assert accepted == [0] and producer.is_alive()
    queue.close()
    producer.join(1)
    assert not producer.is_alive() and accepted == [0, 1, 2]
    queue.put("after", 0)
    with pytest.raises(TimeoutError):
        _get_within(queue, 0.2)  # nothing was kept


def _get_within(queue: RowQueue, seconds: float):
    got: list = []
    reader = threading.Thread(target=lambda: got.append(queue.get()), daemon=True)
    reader.start()
    reader.join(seconds)
    if not got:
        raise TimeoutError
    return got[0]
