"""Finding one shard's generations in node-level translog streams (issue 30; layout in :mod:`node_format`).

A reader lists a stream's ``data/`` and ``index/`` keys, reads each round's index (the
index blob, or the data blob's trailer when the index blob is gone or damaged), and keeps
the shard's sections as uploaded generations (:class:`RemoteGeneration` with an offset).
Index records never change once written, so decoded ones are cached per key.

Cost per stream: 2 LIST, plus one small GET per round not cached yet.  A round whose data
blob is gone while its index names the shard keeps its entries: reading them then fails
naming the blob, and the restore audit turns that into the lost seq# range.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobNotFound
from shardstore.errors import ShardstoreError
from shardstore.translog.node_format import (
    DATA_DIR,
    INDEX_DIR,
    NODE_TRANSLOG_DIR,
    RoundIndex,
    data_key,
    decode_index,
    index_from_data,
    index_key,
    parse_round,
)
from shardstore.translog.remote_metadata import RemoteGeneration

log = logging.getLogger(__name__)

_CACHE_SIZE = 8192
_cache: OrderedDict[tuple[str, str], RoundIndex] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(store: BlobStore, key: str) -> RoundIndex | None:
    with _cache_lock:
        found = _cache.get((store.location, key))
        if found is not None:
            _cache.move_to_end((store.location, key))
        return found


def _remember(store: BlobStore, key: str, index: RoundIndex) -> None:
    with _cache_lock:
        _cache[(store.location, key)] = index
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)


def list_rounds(store: BlobStore, stream: str, first_round: int = 0) -> dict[int, tuple[bool, bool]]:
    """Round -> (data blob listed, index blob listed) of the stream's rounds from ``first_round`` (2 LIST)."""
    found: dict[int, tuple[bool, bool]] = {}
    for sub, at in ((DATA_DIR, 0), (INDEX_DIR, 1)):
        for info in store.list(f"{stream}/{sub}"):
            try:
                r = parse_round(info.key)
            except ValueError:
                continue
            if r >= first_round:
                have = list(found.get(r, (False, False)))
                have[at] = True
                found[r] = (have[0], have[1])
    return found


def read_round(store: BlobStore, stream: str, round_no: int, have: tuple[bool, bool],
               faults: list[str] | None = None) -> RoundIndex | None:
    """A round's index: its index blob, else its data blob's trailer; None (a fault named) if neither reads."""
    ikey, dkey = index_key(stream, round_no), data_key(stream, round_no)
    found = _cached(store, ikey)
    if found is not None:
        return found
    problems = []
    if have[1]:
        try:
            found = decode_index(store.get(ikey), ikey)
        except BlobNotFound:
            problems.append(f"{ikey}: missing")
        except ShardstoreError as exc:
            problems.append(f"{ikey}: {exc}")
    if found is None and have[0]:
        try:
            found = index_from_data(store.get(dkey), dkey)
            if problems:
                log.warning("node translog: index of round %d of %s unreadable (%s); read from the data blob",
                            round_no, stream, problems[0])
        except BlobNotFound:
            problems.append(f"{dkey}: missing")
        except ShardstoreError as exc:
            problems.append(f"{dkey}: {exc}")
    if found is None:
        if faults is not None:
            faults.extend(problems)
        return None
    if found.stream != stream or found.round != round_no:
        if faults is not None:
            faults.append(f"{ikey}: names round {found.round} of {found.stream}")
        return None
    _remember(store, ikey, found)
    return found


def shard_entries(store: BlobStore, streams: Iterable[tuple[str, int]], index_uuid: str, shard: int,
                  faults: list[str] | None = None) -> list[RemoteGeneration]:
    """The shard's generations in the given (stream prefix, first round) streams, oldest round first."""
    out: list[RemoteGeneration] = []
    for stream, first in dict(streams).items():
        rounds = list_rounds(store, stream, first)
        for r in sorted(rounds):
            index = read_round(store, stream, r, rounds[r], faults)
            if index is not None:
                out.extend(index.for_shard(index_uuid, shard))
    return out


class StreamCatalog:
    """Every node stream of a cluster from ONE listing of ``<cluster>/node_translog/`` (issue 46).

    What a restore reads a shard's sections through: 1 LIST however many streams (live or
    dead) the cluster holds, where :func:`shard_entries` takes 2 per stream; the round indices
    are read once per process (cached).  The collection of dead streams reads the same listing.
    """

    def __init__(self, store: BlobStore, cluster_uuid: str) -> None:
        self.store = store
        root = f"{cluster_uuid}/{NODE_TRANSLOG_DIR}/"
        #: stream prefix -> round -> its keys (data blob, index blob: either may be missing)
        self.rounds: dict[str, dict[int, list[str]]] = {}
        #: key -> bytes
        self.sizes: dict[str, int] = {}
        for info in store.list(root):
            rest = info.key[len(root):]
            if "/" not in rest:
                continue
            stream = root + rest.split("/", 1)[0]
            self.rounds.setdefault(stream, {})
            self.sizes[info.key] = info.size
            try:
                round_no = parse_round(info.key)
            except ValueError:
                continue
            self.rounds[stream].setdefault(round_no, []).append(info.key)

    @property
    def total_bytes(self) -> int:
        """Bytes of every stream's blobs."""
        return sum(self.sizes.values())

    def have(self, stream: str, round_no: int) -> tuple[bool, bool]:
        """(data blob listed, index blob listed) of one round, as :func:`read_round` takes."""
        keys = self.rounds.get(stream, {}).get(round_no, [])
        return (any(f"/{DATA_DIR}" in k for k in keys), any(f"/{INDEX_DIR}" in k for k in keys))

    def entries(self, index_uuid: str, shard: int, faults: list[str] | None = None) -> list[RemoteGeneration]:
        """The shard's sections in every stream, oldest round first per stream (no request but uncached indices)."""
        out: list[RemoteGeneration] = []
        for stream in self.rounds:
            for r in sorted(self.rounds[stream]):
                index = read_round(self.store, stream, r, self.have(stream, r), faults)
                if index is not None:
                    out.extend(index.for_shard(index_uuid, shard))
        return out


def cluster_streams(store: BlobStore, cluster_uuid: str) -> list[str]:
    """Every node stream of the cluster (one LIST of every round key: a restore's fallback)."""
    return list(StreamCatalog(store, cluster_uuid).rounds)


def forget_cached(store: BlobStore, keys: Iterable[str]) -> None:
    """Drop deleted index keys from the cache (a purge)."""
    with _cache_lock:
        for k in keys:
            _cache.pop((store.location, k), None)


__all__ = ["StreamCatalog", "cluster_streams", "forget_cached", "list_rounds", "read_round", "shard_entries"]
