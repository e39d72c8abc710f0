"""What the node round uploads of a local generation written under ``remote`` durability: its new bytes.

A node-level round used to roll every shard's local generation and upload the sealed file:
per shard and round, a generation file created and two checkpoint files written by temp
file and rename (about 0.4 ms of system calls, most of a 100-shard round).  Under ``remote``
durability the log now keeps what it appends since the last landed round in memory
(:class:`GenerationImage`), and the round uploads those bytes as a :class:`Piece` instead,
without rolling (docs/design/translog.md, "Pieces").

A piece is a self-contained generation image -- the generation's header and schema frame,
then the frames appended since the previous piece -- so every reader parses it exactly as an
uploaded generation (``read_generation``: size, CRC32C, header, frames).  A generation may
so be uploaded as several pieces, in several rounds; they hold disjoint frames.  Byte layout
of ``Piece.data``::

    generation header (frames.GenerationHeader) | schema frame | frame ... frame

where the frames are the local file's bytes ``[start, end)``.  The image keeps only bytes no
round has landed yet: :meth:`GenerationImage.release` drops them once a round landed.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstore.core.ops import NO_OPS
from shardstore.translog.chained import FileRegion
from shardstore.translog.errors import TranslogError


@dataclass(frozen=True)
class Piece:
    """New bytes of one local generation for the node round (see the module)."""

    generation: int
    primary_term: int
    data: bytes  # header + schema frame + the frames of [start, end)
    start: int  # local file offset of its first frame (0: a whole generation read back from its file)
    end: int  # local file offset after its last frame
    min_seq_no: int
    max_seq_no: int
    num_ops: int
    trimmed_above_seq_no: int
    #: a sealed generation read back from its file: the bytes stay there (``data`` is empty), streamed to the store
    #: by the round (issue 46), with their CRC32C taken as they were checked
    region: FileRegion | None = None
    crc: int | None = None

    @property
    def size(self) -> int:
        """How many bytes the piece uploads."""
        return self.region.length if self.region is not None else len(self.data)

    @property
    def part(self) -> bytes | FileRegion:
        """Its bytes for the round's data blob: in memory, or a region of its file."""
        return self.region if self.region is not None else self.data


class GenerationImage:
    """A local generation's bytes not landed remotely yet, as written (``remote`` durability only)."""

    def __init__(self, header: bytes) -> None:
        self.header = header  # the generation header and schema frame: every piece starts with them
        self.base = len(header)  # local offset of data[0]
        self.data = bytearray()
        self.frames: list[tuple[int, int, int, int]] = []  # (end offset, ops, min seq#, max seq#) past base

    @property
    def end(self) -> int:
        """The local offset after the last frame appended."""
        return self.base + len(self.data)

    def append(self, frame_header: bytes, parts: list, count: int, lo: int, hi: int) -> None:
        """Take in one frame as it was written to the file."""
        self.data += frame_header
        for part in parts:
            self.data += part
        self.frames.append((self.end, count, lo, hi))

    def holds(self, start: int) -> bool:
        """Whether the frames from local offset ``start`` (0: the first) on are still held."""
        return max(start, len(self.header)) >= self.base

    def piece(self, generation: int, primary_term: int, start: int, trimmed_above_seq_no: int) -> Piece | None:
        """The frames from local offset ``start`` (0: the first) on as a piece, or None when there are none."""
        start = max(start, len(self.header))
        if start < self.base:
            raise TranslogError(f"generation {generation}: bytes from {start} were released (kept from {self.base})")
        end = self.end
        if start >= end:
            return None
        frames = [f for f in self.frames if f[0] > start]
        live = [f for f in frames if f[1]]
        return Piece(
            generation=generation, primary_term=primary_term,
            data=self.header + bytes(memoryview(self.data)[start - self.base:]),
            start=start, end=end,
            min_seq_no=min((f[2] for f in live), default=NO_OPS),
            max_seq_no=max((f[3] for f in live), default=NO_OPS),
            num_ops=sum(f[1] for f in frames),
            trimmed_above_seq_no=trimmed_above_seq_no,
        )

    def release(self, upto: int) -> None:
        """Forget the bytes before local offset ``upto`` (a round landed them)."""
        cut = min(upto, self.end) - self.base
        if cut <= 0:
            return
        del self.data[:cut]
        self.base += cut
        self.frames = [f for f in self.frames if f[0] > self.base]


__all__ = ["GenerationImage", "Piece"]
