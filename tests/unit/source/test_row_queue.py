"""source/spill.RowQueue: what a streamed Spark read holds for inserts that lag behind its scan."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from cdc2ch.source.sparkread.spill import RowQueue

pytestmark = pytest.mark.unit


def _batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(first, first + rows), pa.int64()), "s": ["x"] * rows})


def _spilled_files(queue: RowQueue) -> list[str]:
    return sorted(os.listdir(queue._dir)) if queue._dir else []


def test_batches_beyond_the_limit_wait_on_disk_and_come_back_in_order():
    queue = RowQueue(250)
    for i in range(5):
        queue.put(_batch(100 * i, 100), 100)
    assert (
        queue.spilled == 3 and len(_spilled_files(queue)) == 3
    )  # 200 rows in memory, a third would pass 250
    assert queue.get().column(0)[0].as_py() == 0  # 100 rows in memory now: the next batch fits there
    queue.put(_batch(500, 100), 100)
    assert queue.spilled == 3
    got = [queue.get() for _ in range(5)]
    assert [b.column(0)[0].as_py() for b in got] == [100, 200, 300, 400, 500]
    assert got[2].equals(_batch(300, 100))  # read back whole
    assert _spilled_files(queue) == []  # each file removed as it is read
    queue.close()


def test_a_batch_larger_than_the_limit_stays_in_memory_alone_and_items_of_no_rows_never_spill():
    queue = RowQueue(50)
    queue.put(_batch(0, 80), 80)  # nothing else waits
    queue.put("end")
    queue.put(_batch(80, 10), 10)
    assert queue.spilled == 1
    assert [queue.get().num_rows, queue.get(), queue.get().num_rows] == [80, "end", 10]
    queue.close()


def test_close_removes_what_waits_on_disk_and_drops_later_items():
    queue = RowQueue(100)
    for i in range(3):
        queue.put(_batch(100 * i, 100), 100)
    spill_dir = queue._dir
    assert spill_dir and len(os.listdir(spill_dir)) == 2
    queue.close()
    assert not os.path.exists(spill_dir)
    queue.put(_batch(0, 10), 10)
    queue.put("end")
    assert not queue._items


def test_a_batch_spilled_while_the_queue_closes_leaves_nothing_on_disk(monkeypatch):
    """close() removes the spill directory while the giver may be writing a file into it, outside the lock:
    a listing taken before the file existed leaves the file and the directory. The giver removes both once
    it sees the queue closed."""
    from cdc2ch.source.sparkread import spill

    queue = RowQueue(100)
    queue.put(_batch(0, 100), 100)
    queue.put(_batch(100, 100), 100)  # spilled: the directory exists
    spill_dir = queue._dir
    new_file = spill.pa.ipc.new_file

    def closed_meanwhile(sink, schema):
        with queue._cond:  # what close() does under its lock; its removal ran before this file existed
            queue._closed, queue._dir = True, None
        return new_file(sink, schema)

    monkeypatch.setattr(spill.pa.ipc, "new_file", closed_meanwhile)
    queue.put(_batch(200, 100), 100)
    assert spill_dir is not None and not os.path.exists(spill_dir)


def test_a_taker_waits_for_the_next_item():
    queue, got = RowQueue(10), []
    taker = threading.Thread(target=lambda: got.append(queue.get()), daemon=True)
    taker.start()
    taker.join(0.1)
    assert taker.is_alive() and not got
    queue.put("end")
    taker.join(10)
    assert got == ["end"]
