"""What a promoted copy must upload again: its operations above the global checkpoint that no older term's
remote translog holds (docs/design/engine.md, invariant 1 and "A promotion uploads no history").

A primary replicates while its own translog upload is in flight, so a replica may hold an
operation the store never got: a write never acknowledged (the primary's upload failed, or
its process died first), yet live on that copy once promoted and resynced to the others,
which a restore from the store must find as well.

* Operations at or below the global checkpoint were uploaded: a primary counts its own
  operation processed (so the checkpoints move) only once its upload landed.
* Of those above it, an operation of term ``t`` at or below the highest seq# of term ``t``'s
  uploaded generations is held by the store: a primary stamps and logs its own writes in
  seq# order under its copy lock and uploads its generations in order, so the uploaded
  generations of a term hold every write of that term up to their highest seq#.

:func:`not_uploaded` is the pure decision; :func:`uploaded_tops` reads what it needs (one
LIST and one GET per term, a read error meaning only that more is uploaded).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.errors import ShardstoreError
from shardstore.translog.remote import latest_metadata, stream_entries

__all__ = ["not_uploaded", "uploaded_tops"]

log = logging.getLogger(__name__)


def not_uploaded(ops: pa.Table, tops: dict[int, int]) -> pa.Table:
    """The rows of ``ops`` (stamped operations above the global checkpoint) the store may not hold: every row
    except those of a term ``t`` in ``tops`` at or below ``tops[t]`` (term ``t``'s highest uploaded seq#)."""
    keep = pa.array(np.ones(ops.num_rows, dtype=bool))
    terms, seqs = ops.column("primary_term"), ops.column("seq_no")
    for term, top in tops.items():
        keep = pc.and_(keep, pc.invert(pc.and_(pc.equal(terms, term), pc.less_equal(seqs, top))))
    return ops.filter(keep)


def uploaded_tops(store: BlobStore, address: ShardAddress, terms: Iterable[int]) -> dict[int, int]:
    """Per term of ``terms``, the highest seq# its newest remote translog metadata lists as uploaded (a term
    whose metadata is missing, empty or unreadable is left out: its operations are uploaded again)."""
    tops: dict[int, int] = {}
    for term in terms:
        try:
            found = latest_metadata(store, address.translog_prefix(term))
            listed = [*found[1].entries, *stream_entries(store, found[1])] if found else []
        except ShardstoreError as exc:
            log.info("%s: reading term %d's translog metadata failed (%r); its operations are uploaded again",
                     address.translog_prefix(term), term, exc)
            continue
        maxes = [e.max_seq_no for e in listed if e.primary_term == term]
        if maxes:
            tops[term] = max(maxes)
    return tops
