"""Which storage globs Python lists (source/tablelisting.py): S3's, in the glob syntax Python matches as Hadoop
does; the others go to Hadoop, and so does any listing pyarrow cannot make."""

from __future__ import annotations

import pytest

from cdc2ch.model.objectstore import S3Settings
from cdc2ch.source.tablelisting import LakeTables, s3_directories


@pytest.mark.parametrize(
    "glob",
    [
        "abfss://c@acct.dfs.core.windows.net/lake/*",
        "gs://bucket/lake/*",
        "s3a://bucket/lake/{orders,items}",  # Hadoop's alternatives
        "s3a://bucket/lake/[^x]*",  # Hadoop's negated class
        "s3a://bucket/lake/a\\*b",  # an escape
    ],
)
def test_other_storage_and_hadoop_syntax_are_left_to_hadoop(glob):
    assert s3_directories(glob, S3Settings()) is None


def test_a_store_pyarrow_cannot_reach_is_listed_by_hadoop(monkeypatch):
    """(Hadoop's listing then says what is wrong, as for any storage error.)"""

    def refused(glob, s3):
        raise OSError("AWS Error ACCESS_DENIED")

    def spark():
        raise RuntimeError("Spark asked for")

    monkeypatch.setattr("cdc2ch.source.tablelisting.s3_directories", refused)
    with pytest.raises(RuntimeError, match="Spark asked for"):
        LakeTables(spark).directories("s3a://bucket/lake/*", "a test")
