"""A primary's write between staging and acknowledgement, and the refresh its full buffer starts beside it.

:class:`Staged` is a batch applied and logged locally whose translog upload is in flight
(:meth:`ShardCopy.settle` waits for it).  :class:`Refreshing` writes the segments of an indexing
buffer that batch filled, sealed out of the write path (``ShardDirectory.seal``), on a thread of its
own: the batch's translog frame is encoded and uploaded, and the next bulks are applied, while the
segments are written (issue 31: overlap with the append; issue 44: the writes no longer wait for it;
docs/design/segments.md, "A full buffer is refreshed beside the writes").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardstore.segments import row_cache

if TYPE_CHECKING:
    from shardstore.segments.directory import RefreshResult, Sealed, ShardDirectory
    from shardstore.translog.factory import ShardRemoteTranslog

__all__ = ["Refreshing", "Staged"]


@dataclass(frozen=True)
class Staged:
    """A primary's batch applied and logged locally whose upload is in flight (:meth:`ShardCopy.primary_apply`)."""

    seq_nos: tuple[int, int]  # first..last: a primary stamps contiguous seq#s
    remote: ShardRemoteTranslog | None  # None: nothing to wait for (no remote translog; already counted processed)
    position: tuple[int, int]  # the local append's (generation, offset): the upload to wait for


class Refreshing:
    """A sealed buffer's segments written on a thread of its own; ``done(result, error)`` is called when it ends.

    Nothing waits for it to acknowledge a write: its operations are in the translog, and until its segments are
    installed they stay visible to version lookups and realtime gets (``ShardDirectory.write_sealed``).  The next
    seal waits for it (one at a time), and so does closing the directory (``ShardDirectory._settle_sealed``): nothing
    joins the thread.  ``following()`` seals the buffer that filled meanwhile (``ShardCopy._seal_following``); its
    write then runs on a ``Refreshing`` of its own, with the same callbacks.
    """

    def __init__(self, directory: ShardDirectory, sealed: Sealed, shard: int,
                 done: Callable[[RefreshResult | None, BaseException | None], None],
                 following: Callable[[], Sealed | None] = lambda: None) -> None:
        self._directory = directory
        self._sealed = sealed
        self._shard = shard
        self._done = done
        self._following = following
        threading.Thread(target=self._run, name=f"refresh-{shard}", daemon=True).start()

    def _run(self) -> None:
        try:
            with row_cache.warmer.foreground():  # a write: the row-cache warmer decodes nothing new meanwhile
                result = self._directory.write_sealed(self._sealed)
        except BaseException as exc:  # noqa: BLE001 - handed to the copy's callback (ShardCopy._refreshed_beside)
            self._done(None, exc)
            return
        # the buffer that filled while this one was written is sealed now and written next, on a thread of its own,
        # before this one's callback (which may wait for the copy's lock while a bulk is staged)
        following = self._following()
        if following is not None:
            Refreshing(self._directory, following, self._shard, self._done, self._following)
        self._done(result, None)
