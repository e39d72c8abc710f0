"""The remote segment store: commits of one shard uploaded to its blob store, restored, collected.

Layout (the index's :class:`~shardstore.core.path_strategy.PathStrategy` decides the
prefixes; plain layout shown)::

    <cluster_uuid>/<term>/<index_uuid>/<shard>/segments/data/<file>__<uuid>
    <cluster_uuid>/<term>/<index_uuid>/<shard>/segments/metadata/<inv_term>__<inv_gen>__<writer>
    <term marker prefix>/<inv_term>            one per primary term that claimed the shard
    <lock prefix>/<metadata name>__<lock id>    reader leases and snapshot locks

Upload of a commit (:meth:`RemoteSegmentStore.upload`), docs/design/segments.md:

1. the files the remote does not have yet are PUT in parallel, each under a new unique
   key, each checked against its CRC32C before it leaves the node;
2. then ONE metadata blob is PUT with ``if_absent``: the commit exists from that moment.

Cost: (new files) + 1 PUTs and no LIST in steady state, whatever the shard's size.
A failed upload is resumed by calling :meth:`upload` again on the same instance: keys
chosen for a file are reused and a PUT that landed although it reported failure is
recognised by its writer token, so no file is uploaded twice.

Fencing: each primary writes its term marker (``if_absent``) before its first upload,
and checks before each metadata PUT that no newer term has claimed the shard; a stale
primary gets :class:`CommitConflict`.  Readers pick the newest term's commits, so a
zombie's metadata under its own older term is never chosen.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.core.address import ShardAddress
from shardstore.core.path_strategy import PathStrategy, PlainPathStrategy, parse_term_marker_key
from shardstore.core.records import crc32c, decode_record, encode_record
from shardstore.fileio import mapped, write_atomic
from shardstore.progress import Progress
from shardstore.segments.claim_log import append_claim
from shardstore.segments.commit import CommitPoint, write_commit
from shardstore.segments.errors import (
    CommitConflict,
    CommitNotFound,
    SegmentCorrupted,
    SegmentError,
    TermAlreadyClaimed,
    UploadCancelled,
)
from shardstore.segments.gc import GcPlan, RemoteCommitRef, RemoteFileRef, plan_remote_gc
from shardstore.segments.remote_metadata import (
    DATA_DIR,
    METADATA_DIR,
    RemoteCommitMetadata,
    RemoteFile,
    data_key,
    metadata_key,
    parse_metadata_key,
)

log = logging.getLogger(__name__)
#: Files above this many bytes are streamed to disk, never held in memory whole (:func:`get_verified` reads the rest).
STREAM_OVER = 64 * 1024 * 1024
#: how many of its own commits an uploader remembers for GC (more than any keep_last in use)
WRITTEN_REMEMBERED = 64


@dataclass(frozen=True)
class RestoreResult:
    """What a restore brought back, and which newer commits it had to skip and why."""

    commit: CommitPoint
    metadata_key: str
    skipped: tuple[tuple[str, str], ...] = ()  # (metadata key, reason)
    files: int = 0
    bytes: int = 0


def _join(prefix: str, key: str) -> str:
    return f"{prefix.rstrip('/')}/{key}"


# --------------------------------------------------------------------------- the index's path strategy record

STRATEGY_MAGIC = b"SSPS"
STRATEGY_VERSION = 1


def strategy_record_key(cluster_uuid: str, index_uuid: str) -> str:
    """Where an index's path strategy is recorded: a fixed, strategy-independent key."""
    PlainPathStrategy().shard_prefix(cluster_uuid, 0, index_uuid, 0, "segments")  # validates both UUIDs
    return f"{cluster_uuid}/indices/{index_uuid}/path_strategy"


def record_path_strategy(store: BlobStore, cluster_uuid: str, index_uuid: str, strategy: PathStrategy) -> PathStrategy:
    """Record the index's strategy once (``if_absent``); a different recorded one raises CommitConflict.

    The layout of existing data must never change: the first writer's choice wins and
    every later primary (or reader) must use it.
    """
    key = strategy_record_key(cluster_uuid, index_uuid)
    body = encode_record(STRATEGY_MAGIC, STRATEGY_VERSION, strategy.to_dict())
    try:
        store.put(key, body, if_absent=True)
        return strategy
    except BlobAlreadyExists:
        recorded = load_path_strategy(store, cluster_uuid, index_uuid)
        if recorded != strategy:
            raise CommitConflict(
                f"{store.location}/{key}: index {index_uuid} is laid out with {recorded.to_dict()}, "
                f"not {strategy.to_dict()}; the path strategy never changes under existing data"
            ) from None
        return recorded


def load_path_strategy(store: BlobStore, cluster_uuid: str, index_uuid: str) -> PathStrategy:
    """The index's recorded path strategy (CommitNotFound if none was recorded)."""
    key = strategy_record_key(cluster_uuid, index_uuid)
    try:
        data = store.get(key)
    except BlobNotFound:
        raise CommitNotFound(f"{store.location}/{key}: no path strategy recorded for index {index_uuid}") from None
    _v, body = decode_record(data, magic=STRATEGY_MAGIC, supported=STRATEGY_VERSION, where=key, what="path strategy",
                            corrupt=SegmentCorrupted)
    return PathStrategy.from_dict(body)


# --------------------------------------------------------------------------- reading (no primary needed)


def list_terms(store: BlobStore, address: ShardAddress) -> list[int]:
    """Every primary term that claimed the shard, newest first (one LIST)."""
    terms = {parse_term_marker_key(b.key) for b in store.list(address.term_marker_prefix() + "/")}
    return sorted(terms, reverse=True)


def known_terms(store: BlobStore, address: ShardAddress, at_least: int = 0) -> list[int]:
    """Every term that claimed the shard or left blobs under its prefixes, newest first.

    The term markers list the terms that claimed it; terms ``1..at_least`` (the highest term
    the cluster state knows) are also probed for segment or translog blobs, so a lost term
    marker never makes a shard with data read as empty (issue 14, case 1).  One LIST per
    marker listing, up to two per probed term (restore only).
    """
    terms = set(list_terms(store, address))
    for term in range(1, at_least + 1):
        if term not in terms and _holds_blobs(store, address, term):
            terms.add(term)
    top = max([at_least, *terms])
    terms.update(range(top + 1, _first_empty_above(store, address, top)))
    return sorted(terms, reverse=True)


def _first_empty_above(store: BlobStore, address: ShardAddress, known: int) -> int:
    """The first term above ``known`` whose prefixes hold no blob.

    Terms above what the markers and the cluster state know may hold data: the newest marker
    lost while the cluster state's term lagged (its publication had failed) hid the newest
    term's data, and a new primary then claimed that term again (fault simulator, seed 9641).
    Usually one probe (one or two LISTs).
    """
    term = known + 1
    while _holds_blobs(store, address, term):
        term += 1
    return term


def _holds_blobs(store: BlobStore, address: ShardAddress, term: int) -> bool:
    """Whether ``term``'s segment or translog prefix of the shard holds any blob (one or two LISTs)."""
    return any(next(iter(store.list(p.rstrip("/") + "/")), None) is not None
               for p in (address.segments_prefix(term), address.translog_prefix(term)))


def next_free_term(store: BlobStore, address: ShardAddress, at_least: int = 0) -> int:
    """A term for a new primary: above ``at_least``, every claimed term and every term whose prefixes hold blobs
    (one LIST of the markers, then the probe above them; the terms below need no probe)."""
    return _first_empty_above(store, address, max(at_least, latest_term(store, address) or 0))


def latest_term(store: BlobStore, address: ShardAddress) -> int | None:
    """The newest term that claimed the shard (the seed's ``primary_term_latest``), or None."""
    first = next(iter(store.list(address.term_marker_prefix() + "/")), None)
    return None if first is None else parse_term_marker_key(first.key)


def list_commit_keys(store: BlobStore, address: ShardAddress, term: int) -> list[str]:
    """Metadata keys of ``term``'s commits, newest first."""
    return [b.key for b in store.list(_join(address.segments_prefix(term), METADATA_DIR))]


def read_metadata(store: BlobStore, key: str) -> RemoteCommitMetadata:
    """Read and verify one commit metadata blob."""
    try:
        data = store.get(key)
    except BlobNotFound:
        raise CommitNotFound(f"{store.location}/{key}: remote commit metadata not found") from None
    md = RemoteCommitMetadata.decode(data, key)
    term, gen, _writer = parse_metadata_key(key)
    if (term, gen) != (md.primary_term, md.generation):
        raise SegmentCorrupted(key, f"key names term {term} generation {gen}, the record term "
                                    f"{md.primary_term} generation {md.generation}")
    return md


def iter_commits(store: BlobStore, address: ShardAddress, terms: Sequence[int] | None = None) -> Iterator[str]:
    """Every commit metadata key, newest term first, newest generation first within a term."""
    for term in list_terms(store, address) if terms is None else sorted(terms, reverse=True):
        yield from list_commit_keys(store, address, term)


def latest_commit(store: BlobStore, address: ShardAddress, generation: int | None = None, *,
                  max_seq_no: int | None = None) -> RemoteCommitMetadata:
    """The newest readable commit (of ``generation``; holding no operation above ``max_seq_no``).

    Unreadable commits are skipped.  CommitNotFound names them, or, with ``max_seq_no``,
    which seq#s the store's commits reach (older ones were collected, or never existed).
    """
    reasons, reached = [], []
    for key in iter_commits(store, address):
        if generation is not None and parse_metadata_key(key)[1] != generation:
            continue
        try:
            md = read_metadata(store, key)
        except (SegmentCorrupted, CommitNotFound) as exc:
            reasons.append(f"{key}: {exc}")
            continue
        if max_seq_no is None or md.commit.max_seq_no <= max_seq_no:
            return md
        reached.append(md.commit.max_seq_no)
    if max_seq_no is not None:
        raise CommitNotFound(f"{store.location}: shard {address.index_uuid}/{address.shard}: no remote commit holds "
                             f"only operations up to seq# {max_seq_no} (the store's commits reach seq# "
                             f"{sorted(reached)[:10]}); older commits were collected or never existed")
    what = "no commit" if generation is None else f"no commit of generation {generation}"
    raise CommitNotFound(f"{store.location}: {what} for shard {address.index_uuid}/{address.shard}"
                         + (f" (unreadable: {'; '.join(reasons)})" if reasons else ""))


def download_file(store: BlobStore, remote: RemoteFile, path: str, *, durable: bool = True) -> int:
    """Download one blob to ``path`` atomically, verifying size and CRC32C first; returns its size.

    Blobs up to 64 MiB are read whole; bigger ones stream to ``<path>.<unique>.part`` in
    8 MiB blocks, checksummed on the way (unique: two processes sharing a cache, Spark tasks
    reading ranges of one segment, never write one temp file).  Nothing lands at ``path``
    unless it verified.  ``durable=False`` skips the fsyncs: for a cache whose every later
    use checks the file's size and CRC32C again (:func:`~shardstore.segments.read_plan.fetch_verified`),
    where a copy torn by a crash is downloaded again (docs/design/segments.md, "Read plan").
    """
    directory, name = os.path.split(path)
    if remote.size <= STREAM_OVER:
        write_atomic(directory, name, get_verified(store, remote), fsync=durable)
        return remote.size
    tmp = f"{path}.{uuid.uuid4().hex[:12]}.part"
    crc, size = 0, 0
    try:
        with store.open_read(remote.key) as src, open(tmp, "wb") as dst:
            while block := src.read(8 * 1024 * 1024):
                crc, size = crc32c(block, crc), size + len(block)
                dst.write(block)
            dst.flush()
            if durable:
                os.fsync(dst.fileno())
    except BlobNotFound:
        raise SegmentCorrupted(remote.key, "blob named by the commit is missing") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if (size, crc) != (remote.size, remote.checksum):
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise _mismatch(remote, size, crc)
    os.replace(tmp, path)
    return size


def get_verified(store: BlobStore, remote: RemoteFile) -> bytes:
    """The whole blob ``remote`` names, checked against the size and CRC32C its commit records (one GET).

    SegmentCorrupted names the blob when it is missing or its bytes differ: nothing reads unverified bytes.
    """
    try:
        data = store.get(remote.key)
    except BlobNotFound:
        raise SegmentCorrupted(remote.key, "blob named by the commit is missing") from None
    crc = crc32c(data)
    if (len(data), crc) != (remote.size, remote.checksum):
        raise _mismatch(remote, len(data), crc)
    return data


def _mismatch(remote: RemoteFile, size: int, crc: int) -> SegmentCorrupted:
    return SegmentCorrupted(remote.key, f"size/CRC32C {size}/{crc:#010x}, the commit says "
                                        f"{remote.size}/{remote.checksum:#010x}")


def restore(store: BlobStore, address: ShardAddress, target_dir: str,
            terms: Sequence[int] | None = None, keys: Sequence[str] | None = None,
            known: Mapping[str, RemoteCommitMetadata] | None = None) -> RestoreResult:
    """Download the newest valid commit into ``target_dir``; fall back past broken ones and say why.

    ``terms``: the shard's terms to look in (default: those its term markers list);
    ``keys``: the commit metadata keys to try, in this order (default: newest term first);
    ``known``: metadata the caller already read and verified (not fetched again).
    """
    os.makedirs(target_dir, exist_ok=True)
    skipped: list[tuple[str, str]] = []
    for key in (keys if keys is not None else iter_commits(store, address, terms)):
        written: list[str] = []
        try:
            md = known[key] if known is not None and key in known else read_metadata(store, key)
            total = sum(f.size for f in md.files.values())
            with Progress(f"restore {address.index_uuid}/{address.shard} from {key}", total=len(md.files),
                          unit="files") as progress:
                for name, remote in sorted(md.files.items()):
                    path = os.path.join(target_dir, name)
                    download_file(store, remote, path)
                    written.append(path)
                    progress.advance(bytes_=remote.size)
            write_commit(target_dir, md.commit)
        except (SegmentCorrupted, CommitNotFound) as exc:
            reason = str(exc)
            log.warning("restore: skipping commit %s: %s", key, reason)
            skipped.append((key, reason))
            for path in written:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            continue
        return RestoreResult(md.commit, key, tuple(skipped), files=len(written), bytes=total)
    detail = "; ".join(f"{k}: {r}" for k, r in skipped) or "the store holds no commit for it"
    raise CommitNotFound(f"{store.location}: no restorable commit for shard {address.index_uuid}/{address.shard} "
                         f"({detail})", skipped=tuple(skipped))


# --------------------------------------------------------------------------- the primary's uploader


class RemoteSegmentStore:
    """A primary's view of its shard's remote segments: upload commits, collect garbage, lock."""

    def __init__(
        self,
        store: BlobStore,
        address: ShardAddress,
        primary_term: int,
        *,
        upload_concurrency: int = 8,
        writer: str | None = None,
    ) -> None:
        self.store = store
        self.address = address
        self.primary_term = primary_term
        self.upload_concurrency = upload_concurrency
        self.writer = writer or uuid.uuid4().hex
        self.prefix = address.segments_prefix(primary_term)
        self._claimed = False
        #: the claim log epoch of this primary's claim (claim_log.py): it verified the log up to there
        self.claim_epoch: int | None = None
        self._uploaded: dict[tuple[str, int], RemoteFile] = {}  # (name, crc) -> blob, known to exist
        self._keys: dict[tuple[str, int], str] = {}  # key chosen per file (stable across retries)
        self._last: RemoteCommitMetadata | None = None
        self._in_flight: set[str] = set()  # keys uploaded (or uploading) for a commit not yet written
        self._ambiguous: set[str] = set()  # keys whose PUT failed without saying whether it landed
        #: the commits this uploader wrote, newest last: GC keeps them whatever a (stale) listing says
        self._written: dict[str, RemoteCommitRef] = {}

    def __getstate__(self) -> dict:
        return {"store": self.store, "address": self.address, "primary_term": self.primary_term,
                "upload_concurrency": self.upload_concurrency, "writer": self.writer}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state.pop("store"), state.pop("address"), state.pop("primary_term"), **state)

    # -- fencing ----------------------------------------------------------------------------

    def claim_term(self, *, exclusive: bool = False) -> None:
        """Record this primary's term for the shard (``if_absent``); CommitConflict if a newer term claimed it.

        The index's path strategy is recorded first (once per index; a different one
        already recorded is a CommitConflict), so the layout never changes under data.
        ``exclusive``: the term must be new (a batch job claiming a term of its own):
        TermAlreadyClaimed (a CommitConflict) if its marker exists already.
        """
        record_path_strategy(self.store, self.address.cluster_uuid, self.address.index_uuid, self.address.strategy)
        key = self.address.strategy.term_marker_key(self.address.cluster_uuid, self.address.index_uuid,
                                                    self.address.shard, self.primary_term)
        try:
            self.store.put(key, self.writer.encode(), if_absent=True, token=self.writer)
        except BlobAlreadyExists:
            if exclusive:
                raise TermAlreadyClaimed(f"{self.store.location}/{key}: term {self.primary_term} of shard "
                                     f"{self.address.index_uuid}/{self.address.shard} was claimed by another "
                                     f"writer") from None
            # else: this term was claimed before (by us, restarting, or our earlier attempt)
        # into the claim log after the marker and before the marker LIST below: a node's one LIST of the
        # log per translog round then fences this shard's older primaries (claim_log.py, issue 30)
        self.claim_epoch = append_claim(self.store, self.address.cluster_uuid, self.address.index_uuid,
                                        self.address.shard, self.primary_term, self.writer)
        self.check_not_fenced()
        self._claimed = True
        self._adopt_latest_own_commit()

    def check_not_fenced(self) -> None:
        """CommitConflict if a primary of a newer term has claimed the shard (one LIST)."""
        newest = latest_term(self.store, self.address)
        if newest is not None and newest > self.primary_term:
            raise CommitConflict(
                f"{self.store.location}: shard {self.address.index_uuid}/{self.address.shard} was claimed by "
                f"primary term {newest}; this primary (term {self.primary_term}) is stale and may not commit"
            )

    def _adopt_latest_own_commit(self) -> None:
        for key in list_commit_keys(self.store, self.address, self.primary_term):
            try:
                md = read_metadata(self.store, key)
            except (SegmentCorrupted, CommitNotFound):
                continue
            self._last = md
            for name, f in md.files.items():
                self._uploaded[(name, f.checksum)] = f
            return

    # -- upload -----------------------------------------------------------------------------

    @property
    def last_commit(self) -> RemoteCommitMetadata | None:
        """The last commit this primary uploaded (or found of its own term on claiming)."""
        return self._last

    def missing_files(self, commit: CommitPoint) -> dict[str, tuple[int, int]]:
        """The commit's files the remote does not hold yet: what an upload PUTs."""
        return {n: sc for n, sc in commit.files().items() if (n, sc[1]) not in self._uploaded}

    def upload(self, directory: str, commit: CommitPoint, *, cancel: threading.Event | None = None
               ) -> RemoteCommitMetadata:
        """Upload the commit's new files in parallel, then its metadata (``if_absent``, last).

        ``cancel`` set (the copy is closing) stops before the next file and before the
        metadata with :class:`UploadCancelled`; files already sent stay known, so a later
        upload of the same files skips them.
        """
        if commit.primary_term > self.primary_term:
            raise SegmentError(f"commit of term {commit.primary_term} handed to a term-{self.primary_term} uploader")
        if not self._claimed:
            self.claim_term()
        missing = self.missing_files(commit)
        total = sum(size for size, _ in missing.values())
        with Progress(f"upload {self.prefix} commit {commit.generation}", total=len(missing), unit="files") as progress:
            self._send(directory, missing, cancel, progress)
        if cancel is not None and cancel.is_set():
            raise UploadCancelled(f"{self.prefix}: upload of commit {commit.generation} cancelled before its metadata")
        md = self.publish(commit, {n: self._uploaded[(n, c)] for n, (_s, c) in commit.files().items()})
        self._in_flight.clear()
        log.debug("uploaded commit %s (%d new files, %d bytes)", commit.generation, len(missing), total)
        return md

    def upload_ahead(self, directory: str, files: Mapping[str, tuple[int, int]], *,
                     cancel: threading.Event | None = None) -> int:
        """Upload files (name: (size, CRC32C)) before the commit naming them exists; returns how many were sent.

        A big refresh's segments go up as soon as they are written, as OpenSearch uploads
        segments on refresh, so the next flush's :meth:`upload` finds them sent and only
        writes its metadata (docs/design/segments.md, "Uploads ahead of the commit").
        Until a commit is published they count as in flight: GC keeps them.  Callers
        serialise it with :meth:`upload` (the engine's per-copy upload lock).
        """
        if not self._claimed:
            self.claim_term()
        missing = {n: sc for n, sc in files.items() if (n, sc[1]) not in self._uploaded}
        self._send(directory, missing, cancel, None)
        return len(missing)

    def _send(self, directory: str, missing: Mapping[str, tuple[int, int]], cancel: threading.Event | None,
              progress: Progress | None) -> None:
        """PUT ``missing`` (name: (size, CRC32C)) from ``directory`` on up to ``upload_concurrency`` threads."""
        if not missing:
            return
        workers = max(1, min(self.upload_concurrency, len(missing)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="segment-upload") as pool:
            futures = [pool.submit(self._upload_file, directory, n, s, c, cancel) for n, (s, c) in missing.items()]
            for fut in futures:
                remote = fut.result()
                if progress is not None:
                    progress.advance(bytes_=remote.size)

    def publish(self, commit: CommitPoint, files: Mapping[str, RemoteFile]) -> RemoteCommitMetadata:
        """Write the commit's metadata naming ``files`` (already uploaded): fenced, ``if_absent``, last.

        The one place a commit becomes visible (the engine's uploads and the Spark sink's
        jobs): CommitConflict if a newer term claimed the shard or a different metadata
        holds the key; the same bytes already there (our own retried PUT) count as written.
        """
        if commit.primary_term > self.primary_term:
            raise SegmentError(f"commit of term {commit.primary_term} handed to a term-{self.primary_term} publisher")
        md = RemoteCommitMetadata(commit=commit, writer=self.writer, files=dict(files))
        key = _join(self.prefix, metadata_key(commit.primary_term if commit.primary_term else self.primary_term,
                                              commit.generation, self.writer))
        self.check_not_fenced()
        body = md.encode()
        try:
            self.store.put(key, body, if_absent=True, token=self.writer)
        except BlobAlreadyExists:
            if self.store.get(key) != body:
                raise CommitConflict(f"{self.store.location}/{key}: a different commit metadata already exists") from None
        self._last = md
        self._written[key] = RemoteCommitRef(key=key, primary_term=self.primary_term, generation=commit.generation,
                                             files=frozenset(f.key for f in md.files.values()))
        while len(self._written) > WRITTEN_REMEMBERED:
            del self._written[next(iter(self._written))]
        return md

    def _upload_file(self, directory: str, name: str, size: int, checksum: int,
                     cancel: threading.Event | None = None) -> RemoteFile:
        if cancel is not None and cancel.is_set():
            raise UploadCancelled(f"{self.prefix}: upload cancelled before {name}")
        ident = (name, checksum)
        key = self._keys.setdefault(ident, _join(self.prefix, data_key(name, uuid.uuid4().hex)))
        self._in_flight.add(key)
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            # checked through a read-only memory map (no copy of the file in memory), then streamed: the
            # local store copies it in the kernel, an object store sends up to 64 MiB in one PUT
            actual_size = os.fstat(f.fileno()).st_size
            with mapped(f) as view:
                actual = crc32c(view)
            if actual_size != size or actual != checksum:
                raise SegmentCorrupted(path, f"local file has size/CRC32C {actual_size}/{actual:#010x}, "
                                             f"the commit says {size}/{checksum:#010x}; not uploading it")
            self._put(key, None, f)
        remote = RemoteFile(key, size, checksum)
        self._uploaded[ident] = remote
        return remote

    def _put(self, key: str, data: bytes | None, stream) -> None:
        if key in self._ambiguous:  # a failed attempt of ours may have landed: look before sending it again
            try:
                info = self.store.stat(key)
            except BlobNotFound:
                info = None
            if info is not None and info.writer in (None, self.writer):
                self._ambiguous.discard(key)
                return
        self._ambiguous.add(key)
        try:
            if data is not None:
                self.store.put(key, data, if_absent=True, token=self.writer)
            else:
                self.store.put_stream(key, stream, if_absent=True, token=self.writer)
        except BlobAlreadyExists:  # an attempt of ours landed although it reported failure
            info = self.store.stat(key)
            if info.writer not in (None, self.writer):
                raise CommitConflict(f"{self.store.location}/{key}: written by another writer ({info.writer})") from None
        self._ambiguous.discard(key)

    # -- locks ------------------------------------------------------------------------------

    def lock(self, metadata_key_: str, lock_id: str) -> str:
        """Lock a commit against GC (a reader lease or a snapshot); returns the lock's key."""
        if not lock_id or "/" in lock_id or "__" in lock_id:
            raise SegmentError(f"lock id must be non-empty without '/' or '__': {lock_id!r}")
        name = metadata_key_.rsplit("/", 1)[-1]
        key = _join(self.address.lock_prefix(), f"{name}__{lock_id}")
        try:
            self.store.put(key, metadata_key_.encode(), if_absent=True, token=self.writer)
        except BlobAlreadyExists:
            pass
        return key

    def unlock(self, lock_key: str) -> None:
        """Release a lock taken with :meth:`lock`."""
        self.store.delete([lock_key])

    def locked_commits(self) -> frozenset[str]:
        """Metadata keys of every locked commit."""
        out = set()
        for b in self.store.list(self.address.lock_prefix().rstrip("/") + "/"):
            out.add(self.store.get(b.key).decode())
        return frozenset(out)

    # -- garbage collection -----------------------------------------------------------------

    def plan_gc(self, keep_last: int = 10, drop_older_terms_after: int | None = None) -> GcPlan:
        """What :meth:`gc` would delete (reads every commit's metadata; files of an upload in progress are kept)."""
        commits, files = [], []
        terms = list_terms(self.store, self.address)  # markers first, then commits, then files
        for term in terms:
            prefix = self.address.segments_prefix(term)
            for key in list_commit_keys(self.store, self.address, term):
                _t, g, _w = parse_metadata_key(key)  # _t: the commit point's term; a re-upload keeps an older one
                try:
                    md = read_metadata(self.store, key)
                    referenced = frozenset(f.key for f in md.files.values())
                except (SegmentCorrupted, CommitNotFound):
                    referenced = frozenset()  # unreadable: it protects nothing, but is itself deletable
                # ordered and fenced by the term of the primary that wrote it (its prefix's term)
                commits.append(RemoteCommitRef(key=key, primary_term=term, generation=g, files=referenced))
            files += [RemoteFileRef(key=b.key, primary_term=term) for b in self.store.list(_join(prefix, DATA_DIR))]
        # A listing may lag this uploader's own latest PUTs (an eventually consistent store, or a LIST racing
        # its own upload): the commits it wrote count as listed, so their files are never taken for garbage
        # (docs/design/segments.md, "GC under a stale listing"; fault simulator, seed 295).
        listed = {c.key for c in commits}
        commits += [c for k, c in self._written.items() if k not in listed]
        return plan_remote_gc(
            commits, files, keep_last=keep_last, locked=self.locked_commits(),
            caller_term=self.primary_term, in_flight=frozenset(self._in_flight),
            marker_term=terms[0] if terms else None, drop_older_terms_after=drop_older_terms_after,
        )

    def gc(self, keep_last: int = 10, drop_older_terms_after: int | None = None) -> GcPlan:
        """Delete files no retained or locked commit references, then the dropped commits' metadata
        (older terms' commits too once this term has ``drop_older_terms_after`` commits)."""
        plan = self.plan_gc(keep_last, drop_older_terms_after)
        if plan.files:
            self.store.delete(sorted(plan.files))
        if plan.commits:
            self.store.delete(sorted(plan.commits))
            self._written = {k: c for k, c in self._written.items() if k not in plan.commits}
        self._uploaded = {k: v for k, v in self._uploaded.items() if v.key not in plan.files}
        return plan
