import os

from cdc2ch.clickhouse.fileroot import from_root, reads_local_files


def test_statements_that_read_local_files_are_told_apart():
    assert reads_local_files(b"INSERT INTO t SELECT * FROM deltaLakeLocal('/lake/t')")
    assert reads_local_files(b"select * from FILE ('x.csv')")
    assert reads_local_files(b"SELECT * FROM icebergLocal('/lake/i')")
    assert not reads_local_files(b"INSERT INTO t FORMAT Native")
    assert not reads_local_files(b"SELECT profile FROM t")
    assert not reads_local_files(b"SELECT * FROM deltaLake('https://host/t/')")


def test_overlapping_reads_run_from_root_until_the_last_ends(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with from_root():
        assert os.getcwd() == "/"
        with from_root():
            assert os.getcwd() == "/"
        assert os.getcwd() == "/"  # the outer read still runs
    assert os.getcwd() == str(tmp_path)
