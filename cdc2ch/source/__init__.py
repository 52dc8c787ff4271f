"""The source side, one package per adapter: the Delta log read by Python (`deltalog`), Delta tables read
through Spark (`sparkread`) on the process's session (`spark`), and tables shared through Delta Sharing
(`sharing`). `open_source` picks the one `--table` names."""

from __future__ import annotations


def open_source(spark, table: str):
    """The ChangeSource for `table`: a SharedSource for `<profile>#<share>.<schema>.<table>`, else a
    DeltaSource. `spark` is a session, a LazySpark or a function returning a session: it is asked for the
    session only when something needs Spark (a share's rows, a local table's rows, a catalog name)."""
    from cdc2ch.model.tableref import parse_table

    if parse_table(table).is_shared:
        from cdc2ch.base.log import get_logger
        from cdc2ch.source.sharing.sharedsource import SharedSource

        return SharedSource(spark, table, get_logger("cdc2ch.sharing"))
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    return DeltaSource(spark, table)
