"""The answers a Delta Sharing server gives for a range of versions: its change data feed's (`/changes`), or
(LOG) a `/query` since the range's first version, which needs history shared and no feed: each version's
added and removed files and the metaData at each version that changes it. The last answer is kept for the
ranges read right after it, cut from it, while its file URLs stay valid a while."""

from __future__ import annotations

import time
from collections.abc import Callable

from cdc2ch.base.errors import CHANGE_FEED
from cdc2ch.model.changeset import FEED, LOG
from cdc2ch.source.sharing import sharefiles
from cdc2ch.source.sharing.restclient import SharingClient, SharingRefused
from cdc2ch.source.sharing.shareanswer import NoHistory, sliced

CACHE_SECONDS = 60.0  # an answer for a range is reused for the ranges read right after it
URL_MARGIN_MS = 120_000  # ...unless one of its URLs expires within this margin


def read_of(origin: str) -> str:
    """What a range read of `origin` reads, in messages."""
    return CHANGE_FEED if origin == FEED else "the files each version added and removed"


class RangeAnswers:
    """One table's range answers. `check` refuses what cannot be read right; `translate(exc, what, start,
    end)` turns a refusal into advice (NoHistory where the server does not serve the changes)."""

    def __init__(self, client: SharingClient, check: Callable[[list[dict]], None], translate: Callable):
        self.client, self.check, self.translate = client, check, translate
        self._kept: tuple[str, int, int, float, list[dict]] | None = None  # (origin, start, end, at, lines)
        self._feedless = False  # the server refused the feed: versions are listed from the query's answer

    def lines(self, start: int, end: int, origin: str = FEED, fresh: bool = False) -> list[dict]:
        """The answer of `origin` for [start, end] (the kept one when it covers the range, is recent and its
        URLs stay valid a while, unless `fresh`)."""
        kept = self._kept
        now_ms = time.time() * 1000
        if not fresh and kept and kept[0] == origin and kept[1] <= start and end <= kept[2]:
            if time.monotonic() - kept[3] < CACHE_SECONDS and all(
                (a.get("expirationTimestamp") or now_ms * 2) > now_ms + URL_MARGIN_MS
                for _, a in sharefiles.file_actions(kept[4])
            ):
                return sliced(kept[4], start, end)
        try:
            if origin == FEED:
                lines = self.client.changes(start, end)
            else:  # (endingVersion is a hint: later versions may be answered too)
                lines = sliced(self.client.query_since(start, end), start, end)
        except SharingRefused as exc:
            raise self.translate(exc, read_of(origin), start, end) from None
        self.check(lines)
        self._kept = (origin, start, end, time.monotonic(), lines)
        return lines

    def listing(self, start: int, end: int) -> list[dict]:
        """The answer versions [start, end] are listed from: the feed's while the server serves it, else the
        query's since `start` (a table shared with history whose feed does not record them all). Both name
        each version's files and its metaData."""
        if not self._feedless:
            try:
                return self.lines(start, end, FEED)
            except NoHistory:
                self._feedless = True  # (the feed is still asked for the ranges read from it)
        return self.lines(start, end, LOG)
