"""Cluster state: what a one-index publication costs at 1,000 and 10,000 indices, and a full restore.

Per cluster size N (1,000 and 10,000 indices; quick: 1,000 only) on each backend of
``--cluster-state-backends`` (default ``memory``; ``file`` is a local store in a temp
directory, fsync on):

- a state of N indices (2 shards, 1 replica, 12 settings, a 24-field mapping: about
  1.5 KB of JSON each) is written in full and committed (``full_write_seconds``);
- REPS times, one index's primary term is bumped and published incrementally; per
  publication the PUTs and bytes uploaded (``one_index_puts``, ``one_index_bytes``,
  medians).  Target (issue 6): bytes < 2 x (index entity + 64 KiB);
  ``flat_manifest_bytes`` is what a manifest listing every index ref would weigh (the sum
  of the chunk blobs): what a flat manifest would upload on every publication;
- a follower holding the previous state applies the publication from the store
  (manifest, changed chunk, changed entity): ``follower_bytes`` and ``follower_gets``;
- a fresh service restores the newest committed state: ``restore_seconds`` (LIST,
  manifest, every chunk and index entity, all checksums and the fingerprint verified),
  ``restore_mb``.

Byte and request figures do not depend on the backend; times do.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from benches.runner import Context, Figure, run_cleanups

BACKENDS = ("memory", "file")
SIZES, QUICK_SIZES = (1_000, 10_000), (1_000,)
REPS, QUICK_REPS = 5, 3


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--cluster-state-backends", default=None,
                       help=f"comma-separated subset of {','.join(BACKENDS)} (default memory)")
    group.add_argument("--cluster-state-sizes", default=None,
                       help="comma-separated index counts (default 1000,10000; quick 1000)")


def _backends(ctx: Context) -> list[str]:
    text = getattr(ctx.args, "cluster_state_backends", None) or "memory"
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise ValueError(f"unknown backend(s) {bad}; known: {', '.join(BACKENDS)}")
    return names


def _sizes(ctx: Context) -> list[int]:
    text = getattr(ctx.args, "cluster_state_sizes", None)
    if text is None:
        return list(QUICK_SIZES if ctx.quick else SIZES)
    return sorted({int(x.replace("_", "")) for x in text.split(",") if x.strip()})


def _state(n: int) -> Any:
    from shardstore.cluster_state.model import ClusterState, IndexMetadata

    settings = {f"index.setting_{k}": f"value-{k}" for k in range(12)}
    mappings = {"properties": {f"field_{k}": {"type": ("keyword", "long", "date", "text")[k % 4]}
                               for k in range(24)}}
    s = replace(ClusterState.initial(["n1", "n2", "n3"]).successor(1), cluster_uuid_committed=True)
    return s.with_indices([IndexMetadata.create(f"index-{i:06d}", shards=2, replicas=1, settings=settings,
                                                mappings=mappings) for i in range(n)])


def _open(kind: str, base: str, cleanups: list[Callable[[], Any]]) -> Any:
    from shardstore.blobstores import open_store

    if kind == "memory":
        space = f"bench-cs-{uuid.uuid4().hex[:8]}"

        def drop() -> None:
            from shardstore.plugins.memory import MemoryStore

            MemoryStore.drop(space)

        cleanups.append(drop)
        return open_store(f"memory://{space}/root")
    path = os.path.join(base, f"store-{uuid.uuid4().hex[:8]}")
    return open_store(f"file://{path}")


def _cell(ctx: Context, kind: str, n: int, reps: int, base: str, cleanups: list[Callable[[], Any]]) -> Iterator[Figure]:
    from shardstore.cluster_state.entities import encode_entity
    from shardstore.cluster_state.remote import RemoteClusterStateService

    store = _open(kind, base, cleanups)
    svc = RemoteClusterStateService(store)
    cleanups.append(svc.close)
    state = _state(n)
    t0 = time.perf_counter()
    manifest = svc.mark_committed(svc.write_full(state))
    full_s = time.perf_counter() - t0
    ctx.progress(f"{kind} n={n}: full write {full_s:.2f}s, {manifest.chunk_count} chunks")
    params = {"backend": kind, "indices": n}
    yield ctx.figure("full_write_seconds", full_s, "s", **params)

    puts, nbytes, follower_bytes, follower_gets, entity = [], [], [], [], []
    names = sorted(state.indices)
    follower = RemoteClusterStateService(store)
    cleanups.append(follower.close)
    for r in range(reps):
        name = names[(r * 7919) % n]
        new = state.update_index(name, lambda im: im.with_primary_term(0, im.primary_terms[0] + 1)).successor(1)
        store.reset_metrics()
        m2 = svc.mark_committed(svc.write_incremental(state, manifest, new))
        m = store.metrics()
        puts.append(m["requests"]["put"] - 1)  # the commit marker is the second phase, not the upload
        nbytes.append(m["bytes_out"] - len(store.get(m2.key)))
        entity.append(len(encode_entity("index", new.indices[name].to_dict())))
        res = follower.read_published(new.cluster_uuid, new.term, new.version, state)
        assert res.incremental and res.state == new, "the follower must apply the publication incrementally"
        follower_bytes.append(res.bytes_downloaded)
        follower_gets.append(res.gets)
        state, manifest = new, m2
    limit = 2 * (statistics.median(entity) + 64 * 1024)
    med_bytes = statistics.median(nbytes)
    yield ctx.figure("one_index_puts", statistics.median(puts), "puts", **params)
    yield ctx.figure("one_index_bytes", med_bytes, "bytes", target=f"< {int(limit)}", met=med_bytes < limit,
                     entity_bytes=int(statistics.median(entity)), **params)
    yield ctx.figure("flat_manifest_bytes", sum(c.size for c in manifest.chunks.values()), "bytes", **params)
    yield ctx.figure("follower_bytes", statistics.median(follower_bytes), "bytes", **params)
    yield ctx.figure("follower_gets", statistics.median(follower_gets), "gets", **params)

    fresh = RemoteClusterStateService(store)
    cleanups.append(fresh.close)
    store.reset_metrics()
    t0 = time.perf_counter()
    restored = fresh.restore_latest(state.cluster_uuid)
    restore_s = time.perf_counter() - t0
    assert restored.state == state, "restore must return the last committed state"
    yield ctx.figure("restore_seconds", restore_s, "s", gets=store.metrics()["requests"]["get"], **params)
    yield ctx.figure("restore_mb", store.metrics()["bytes_in"] / 1e6, "MB", **params)


def run(ctx: Context) -> Iterator[Figure]:
    """Full write, one-index publications, follower download and restore per backend and size."""
    kinds = _backends(ctx)
    sizes = _sizes(ctx)
    reps = QUICK_REPS if ctx.quick else REPS
    base = tempfile.mkdtemp(prefix="shardstore-bench-cluster-state-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    try:
        for kind in kinds:
            for n in sizes:
                yield from _cell(ctx, kind, n, reps, base, cleanups)
    finally:
        run_cleanups(cleanups, "[cluster_state] cleanup")
