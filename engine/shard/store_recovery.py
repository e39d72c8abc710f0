"""What a shard copy rebuilt from the blob store alone starts from: the newest valid remote commit, restored into
its index directory, and the remote translog above it, with what could not be brought back (issue 14, case 1).

The copy itself (replay, promotion) is :meth:`ShardCopy.recover_from_remote`; the decision
whether anything acknowledged is missing is :mod:`~shardstore.engine.shard.restore_check`
(docs/design/engine.md, "Restore never returns less").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.engine.shard.restore_audit import Evidence, audit
from shardstore.engine.shard.restore_check import ShardLoss, missing_ranges
from shardstore.segments.errors import CommitNotFound
from shardstore.segments.remote_store import known_terms, restore
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.remote import RemoteTranslog, apply_trims, section_path
from shardstore.translog.tracker import NO_OPS_PERFORMED

__all__ = ["StoreContents", "read_from_store"]


@dataclass(frozen=True)
class StoreContents:
    """The operations above the restored commit, and the seq# ranges the store could not bring back (or None)."""

    batches: list[pa.RecordBatch]
    loss: ShardLoss | None


def read_from_store(store: BlobStore, addr: ShardAddress, index_dir: str, *, known_term: int, index_name: str,
                    acknowledged_max: int) -> StoreContents:
    """Restore the newest valid commit of ``addr`` into ``index_dir`` and read the remote translog above it.

    Every seq# the store says was acknowledged is accounted for: what cannot be read is in
    ``loss``, naming the ranges and the blobs at fault.  ``known_term``: the highest primary
    term the cluster state knows (a lost term marker hides nothing); ``acknowledged_max``: the
    highest seq# the live cluster acknowledged for the shard (fault simulator, seed 20033).
    """
    terms = known_terms(store, addr, at_least=known_term)
    evidence = audit(store, addr, terms)
    faults = list(evidence.faults)
    try:
        # the audit read every commit's metadata: restore tries them best first without reading them again
        result = restore(store, addr, index_dir, keys=evidence.restore_order(), known=dict(evidence.commits))
        above = result.commit.local_checkpoint
        faults += [f"{k}: {r}" for k, r in result.skipped]  # unreadable metadata is not tried: named once
    except CommitNotFound as exc:  # every commit refused: why each was, names the blobs at fault
        above = NO_OPS_PERFORMED
        faults += [f"{k}: {r}" for k, r in exc.skipped]
    batches = _read_translog(store, evidence, above + 1, faults)
    seq_nos = np.concatenate([b.column("seq_no").to_numpy() for b in batches] or [np.empty(0, np.int64)])
    missing = missing_ranges(above + 1, seq_nos, max(evidence.expected_max, acknowledged_max))
    return StoreContents(batches, ShardLoss(index_name, addr.shard, tuple(missing), tuple(faults)) if missing else None)


def _read_translog(store: BlobStore, evidence: Evidence, from_seq_no: int, faults: list[str]) -> list[pa.RecordBatch]:
    """The audited generations' operations from ``from_seq_no``; a generation that cannot be read is left out and named."""
    entries = {(e.blob_key, e.offset): apply_trims(e, evidence.trims) for e in evidence.entries}
    while True:
        try:
            return list(RemoteTranslog.read_entries(store, entries.values(), from_seq_no))
        except TranslogCorruptedError as exc:
            # a node-level round's section is named "<data blob>@<offset>" (remote.section_path)
            bad = [k for k in entries if section_path(k[0], k[1]) == exc.path]
            if not bad:
                raise
            for k in bad:
                e = entries.pop(k)
                faults.append(f"{k[0]}: {exc}" if e.offset < 0 else f"{k[0]} (seq# {e.min_seq_no}-{e.max_seq_no}): {exc}")


