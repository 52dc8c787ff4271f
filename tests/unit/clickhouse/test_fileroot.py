"""Which statements read local files (and so run from /: tests/unit/model/test_anchored.py)."""

from cdc2ch.clickhouse.connection.fileroot import reads_local_files


def test_statements_that_read_local_files_are_told_apart():
    assert reads_local_files(b"INSERT INTO t SELECT * FROM deltaLakeLocal('/lake/t')")
    assert reads_local_files(b"select * from FILE ('x.csv')")
    assert reads_local_files(b"SELECT * FROM icebergLocal('/lake/i')")
    assert not reads_local_files(b"INSERT INTO t FORMAT Native")
    assert not reads_local_files(b"SELECT profile FROM t")
    assert not reads_local_files(b"SELECT * FROM deltaLake('https://host/t/')")
