"""A primary's write between staging and acknowledgement: what :meth:`ShardCopy.settle` waits for.

:class:`Staged` is a batch applied and logged locally whose translog upload is in flight;
:class:`Refreshing` the refresh of the indexing buffer that batch filled, begun on a thread of
its own before the batch's translog frame is encoded (issue 31; docs/design/segments.md, "Uploads
ahead of the commit", "The refresh starts before the append").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardstore.segments.directory import ShardDirectory
    from shardstore.translog.factory import ShardRemoteTranslog

__all__ = ["Refreshing", "Staged"]


@dataclass(frozen=True)
class Staged:
    """A primary's batch applied and logged locally whose upload is in flight (:meth:`ShardCopy.primary_apply`)."""

    seq_nos: tuple[int, int]  # first..last: a primary stamps contiguous seq#s
    remote: ShardRemoteTranslog | None  # None: nothing to wait for (no remote translog; already counted processed)
    position: tuple[int, int]  # the local append's (generation, offset): the upload to wait for
    refreshing: Refreshing | None = None  # the refresh of a full buffer, started before the append


class Refreshing:
    """A refresh of a full indexing buffer on a thread of its own, begun as soon as the batch is buffered.

    The batch's translog frame is then encoded (the append) while the segments are written, on the
    two cores, instead of one after the other (issue 31: the 336,776-row one go spent 70 ms encoding,
    then 206 ms writing segments).  :meth:`ShardCopy.settle` joins it: it never outlives the write.
    """

    def __init__(self, directory: ShardDirectory, shard: int) -> None:
        self.segments: tuple[str, ...] = ()
        self.error: BaseException | None = None
        self._directory = directory
        self._thread = threading.Thread(target=self._run, name=f"refresh-{shard}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.segments = self._directory.refresh().segments
        except BaseException as exc:  # noqa: BLE001 - handed to the joining writer (ShardCopy._await_upload)
            self.error = exc

    def join(self) -> tuple[str, ...]:
        """The new segments once written; the refresh's error, if it failed."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.segments
