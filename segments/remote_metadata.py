"""The remote segment store's commit metadata: which blobs make up one uploaded commit.

One metadata blob is written, ``if_absent`` and LAST, for every uploaded commit; a
remote commit exists exactly when its metadata blob does (docs/design/segments.md,
"Remote commits").  Its key, relative to the shard's segments prefix, is::

    metadata/<inv_term>__<inv_gen>__<writer>

with ``inv(x) = 2**63 - 1 - x`` zero-padded to 19 digits, so one LIST yields the newest
(primary term, generation) first.  Data blobs are ``data/<file name>__<uuid>``: the unique
suffix means a primary never overwrites bytes another one wrote.

The record is a framed JSON record (:mod:`shardstore.core.records`, magic
``b"SSRC"``, format version 1) holding the commit point's body (``commit``, as in
``segments_N``), the primary term and generation, the writer id, and ``files``: local
file name -> ``[blob key relative to the store root, size, CRC32C]``.  Store-root keys
let a commit name blobs a primary of an older term uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstore.core.path_strategy import invert, uninvert
from shardstore.core.records import decode_record, encode_record
from shardstore.errors import InvalidError
from shardstore.segments.commit import CommitPoint
from shardstore.segments.errors import SegmentCorrupted

MAGIC = b"SSRC"
FORMAT_VERSION = 1
METADATA_DIR = "metadata/"
DATA_DIR = "data/"


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One uploaded file: where it is and what its bytes must check to."""

    key: str  # relative to the store root
    size: int
    checksum: int  # CRC32C of the whole file


@dataclass(frozen=True, slots=True)
class RemoteCommitMetadata:
    """What one remote commit metadata blob says."""

    commit: CommitPoint
    writer: str
    files: dict[str, RemoteFile]  # local file name -> uploaded blob

    @property
    def primary_term(self) -> int:
        """The term of the primary that uploaded the commit."""
        return self.commit.primary_term

    @property
    def generation(self) -> int:
        """The commit generation N of ``segments_N``."""
        return self.commit.generation

    def encode(self) -> bytes:
        """The framed bytes of this record."""
        missing = set(self.commit.files()) - set(self.files)
        if missing:
            raise ValueError(f"remote commit metadata lacks blobs for {sorted(missing)}")
        return encode_record(MAGIC, FORMAT_VERSION, {
            "commit": self.commit.to_body(),
            "writer": self.writer,
            "files": {name: [f.key, f.size, f.checksum] for name, f in sorted(self.files.items())},
        })

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, key: str) -> RemoteCommitMetadata:
        """Parse a metadata blob read from ``key`` (SegmentCorrupted names it)."""
        _v, body = decode_record(data, magic=MAGIC, supported=FORMAT_VERSION, where=key, what="remote commit metadata",
                                  corrupt=SegmentCorrupted)
        try:
            commit = CommitPoint.from_body(body["commit"], key)
            files = {str(n): RemoteFile(str(k), int(s), int(c)) for n, (k, s, c) in body["files"].items()}
            md = cls(commit=commit, writer=str(body["writer"]), files=files)
        except (KeyError, TypeError, ValueError) as exc:
            raise SegmentCorrupted(key, f"remote commit metadata body is missing or mistypes a field: {exc!r}") from None
        missing = set(commit.files()) - set(files)
        if missing:
            raise SegmentCorrupted(key, f"names no blob for the commit's files {sorted(missing)}")
        for name, (size, checksum) in commit.files().items():
            f = files[name]
            if (f.size, f.checksum) != (size, checksum):
                raise SegmentCorrupted(key, f"{name}: blob {f.key} records size/CRC {f.size}/{f.checksum}, "
                                            f"the commit {size}/{checksum}")
        return md


def metadata_key(term: int, generation: int, writer: str) -> str:
    """``metadata/<inv_term>__<inv_gen>__<writer>``: the newest (term, generation) sorts first."""
    if not writer or "/" in writer or "__" in writer:
        raise ValueError(f"writer id must be non-empty without '/' or '__': {writer!r}")
    return f"{METADATA_DIR}{invert(term)}__{invert(generation)}__{writer}"


def parse_metadata_key(key: str) -> tuple[int, int, str]:
    """(term, generation, writer) of a metadata key (with or without a leading prefix)."""
    parts = key.rsplit("/", 1)[-1].split("__")
    if len(parts) != 3:
        raise InvalidError(f"not a remote commit metadata key: {key!r}")
    try:
        return uninvert(parts[0]), uninvert(parts[1]), parts[2]
    except InvalidError:
        raise InvalidError(f"not a remote commit metadata key: {key!r}") from None


def data_key(file_name: str, unique: str) -> str:
    """``data/<file name>__<unique>`` (relative to the segments prefix)."""
    return f"{DATA_DIR}{file_name}__{unique}"
