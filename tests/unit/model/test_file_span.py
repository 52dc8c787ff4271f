"""What deriving a range's changes at once reads (model/changeset.FileSpan): the rows of the files it found,
those it rewrote again, those it leaves; and where that pays."""

from __future__ import annotations

from cdc2ch.model import changeset
from cdc2ch.model.changeset import Files, FileSpan


def span(before: int | None, between: int, after: int) -> FileSpan:
    """A span of two commits: the first replaces a file of `before` rows by one of `between`, the second
    that one by one of `after`."""
    found = FileSpan()
    found.take(Files((("b", between, True),), (("a", before, True),)))
    found.take(Files((("c", after, True),), (("b", None, True),)))  # (a remove without statistics)
    return found


def test_files_are_counted_by_where_they_are_at_the_range_end(monkeypatch):
    found = span(10, 20, 5)
    assert (found.before, found.between, found.after, found.read_rows()) == (10, 20, {"c": 5}, 15)
    assert found.after_rows == 5
    assert found.derivable
    found.take(Files((("d", 3, True),), (("c", 5, True), ("z", 7, True))))
    assert (found.before, found.between, found.after) == (17, 25, {"d": 3})
    found.take(Files((), (("y", None, True),)))  # a file from before the range whose rows are not known
    assert not found.derivable and not found.pays()
    assert not FileSpan.of([]).pays()  # nothing rewritten again


def test_a_file_re_added_with_a_vector_was_found_and_is_there_at_the_end():
    """ClickHouse reads each file at a version, as it was then: a span with vectors is derivable, and says it
    has them (Spark, which reads a file by its path, does not derive it at once)."""
    found = FileSpan()
    found.take(Files((("a", 8, True),), (("a", 10, True),), vectors=True))  # 2 of a's rows deleted
    assert (found.before, found.between, found.after) == (10, 0, {"a": 8})
    found.take(Files((("a", 7, True),), (("a", 10, True),), vectors=True))  # 1 more
    assert (found.before, found.between, found.after) == (10, 8, {"a": 7})
    assert found.derivable and found.vectors
    plain = FileSpan()
    plain.take(Files((("b", 1, True),), (("a", 1, True),)))
    plain.take(None)
    assert not plain.vectors


def test_a_span_with_files_not_known_cannot_be_derived():
    unknown = FileSpan()
    unknown.take(None)
    unsized = FileSpan()
    unsized.take(Files((("b", None, True),)))
    twice = FileSpan()  # a path added again without its remove
    twice.take(Files((("b", 1, True),)))
    twice.take(Files((("b", 1, True),)))
    assert not any(s.derivable for s in (unknown, unsized, twice))


def test_deriving_at_once_pays_where_the_files_rewritten_again_outweigh_the_others(monkeypatch):
    """Commit by commit reads each file a range adds and removes again twice; at once pays where those hold
    at least the rows of the files it found and leaves, and enough rows to outweigh its plan."""
    assert span(1_000_000, 16_900_000, 900_000).pays()  # every MERGE rewrites every file
    assert not span(100_000, 200_000, 100_000).pays()  # the same, small: compiling its plan costs more
    assert span(300_000, 1_000_000, 300_000).pays()
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    assert span(10, 20, 10).pays()
    assert not span(10, 19, 10).pays()
    assert not span(7_000_000, 4_300_000, 6_600_000).pays()  # MERGEs of keys clustered in a few files
    assert not span(None, 20, 10).pays()  # a file whose statistics are not known
    assert not span(0, 0, 0).pays()  # nothing rewritten again
