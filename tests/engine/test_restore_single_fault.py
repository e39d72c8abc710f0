"""One lost or corrupt blob never makes a restore return less than was acknowledged (issue 14, case 1).

A real cluster acknowledges 120 documents over six rounds (a flush after each of the first
five, the last round only in the remote translog) and is closed.  Then, for each case, a copy
of its store gets exactly one fault (a blob deleted, a byte flipped, a blob truncated) and
``Cluster.restore`` runs on fresh disks.  The only acceptable outcomes:

- every acknowledged document comes back with its value, or
- ``RestoreDataLoss`` (a ``CorruptError``) naming the shard, the missing seq# range and the
  blob at fault; with ``accept_data_loss=True`` the restore then goes on and reports exactly
  what it dropped.

Before the fix, deleting the newest segment commit, the term marker or the newest translog
metadata, or corrupting a segment file, returned normally with 0 to 100 of the 120 docs.
"""

from __future__ import annotations

import fnmatch
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.engine.errors import RestoreDataLoss
from shardstore.errors import ShardstoreError

ROUNDS, PER_ROUND = 6, 20
N = ROUNDS * PER_ROUND


@pytest.fixture(scope="module", params=["steady", "failover"])
def golden(request, tmp_path_factory) -> Path:
    """A store holding 120 acknowledged docs: five flushed rounds and one in the translog only.

    ``failover``: the primary is killed after round 2 (the replica takes over with term 2, and
    the data spans two terms' prefixes).
    """
    base = tmp_path_factory.mktemp("golden")
    cluster = Cluster(store=f"file://{base / 'remote'}", data_dir=str(base / "nodes"), nodes=3, recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        for r in range(ROUNDS):
            res = cluster.bulk("docs", [{"_id": str(r * PER_ROUND + i), "r": r} for i in range(PER_ROUND)])
            assert not res.errors
            if r < ROUNDS - 1:
                cluster.flush("docs")
            if r == 2 and request.param == "failover":
                cluster.kill_node(cluster.primary_of("docs", 0))
                cluster.wait_for_health("green", timeout=60)
    finally:
        cluster.close()
    return base / "remote"


def _keys(root: Path) -> list[str]:
    return sorted(info.key for info in open_store(f"file://{root}").list(""))


def _term(key: str) -> int:
    """The primary term a shard blob's key is under (``<cluster>/<term>/<index>/<shard>/...``), 0 for others."""
    parts = key.split("/")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _pick(keys: list[str], part: str, newest: bool = True) -> str:
    """The newest (or oldest) key holding ``part``: highest term first, then the names' own order (inverted: newest first)."""
    found = sorted((k for k in keys if (fnmatch.fnmatch(k, part) if "*" in part else part in k)),
                   key=lambda k: (-_term(k), k))
    assert found, f"no blob with {part!r}"
    return found[0] if newest else found[-1]


def _delete(path: Path) -> None:
    path.unlink()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


#: (name, which blob, newest or oldest in listing order, the fault, whether everything must come back):
#: a lost commit, term marker or translog metadata loses nothing (the translog is purged only past
#: the commit before the newest; term markers are re-derived; an orphan data blob is replayed).
#: A damaged segment or translog data blob may be the only copy of its operations: refusing,
#: naming it, is right.
CASES: list[tuple[str, str, bool, Callable[[Path], None], bool]] = [
    ("newest segment commit deleted", "/segments/metadata/", True, _delete, True),
    ("newest segment commit corrupt", "/segments/metadata/", True, _flip, True),
    ("oldest segment commit deleted", "/segments/metadata/", False, _delete, True),
    ("a segment file corrupt", "/segments/data/", True, _flip, False),
    ("a segment file truncated", "/segments/data/", False, _truncate, False),
    ("newest term marker deleted", "/primary_terms/", True, _delete, True),
    ("oldest term marker deleted", "/primary_terms/", False, _delete, True),
    ("oldest translog metadata deleted", "/translog/metadata/", False, _delete, True),
    ("newest translog metadata deleted", "/translog/metadata/", True, _delete, True),
    ("newest translog metadata corrupt", "/translog/metadata/", True, _flip, True),
    # the node-level translog (issue 30): a round's data blob, and its index blob (also in the data blob)
    ("translog data corrupt", "*/node_translog/*/data/*", True, _flip, False),
    ("translog data deleted", "*/node_translog/*/data/*", True, _delete, False),
    ("oldest translog data truncated", "*/node_translog/*/data/*", False, _truncate, False),
    ("newest translog round index deleted", "*/node_translog/*/index/*", True, _delete, True),
    ("newest translog round index corrupt", "*/node_translog/*/index/*", True, _flip, True),
    ("oldest translog round index truncated", "*/node_translog/*/index/*", False, _truncate, True),
    ("newest cluster-state manifest deleted", "/cluster-state/manifest/", True, _delete, True),
    ("newest cluster-state manifest corrupt", "/cluster-state/manifest/", True, _flip, True),
    ("newest index entity corrupt", "/cluster-state/index/", False, _flip, True),
    ("newest routing entity deleted", "/cluster-state/routing/", False, _delete, True),
    ("newest index-list chunk corrupt", "/cluster-state/chunk/", False, _flip, True),
    ("coordination entity corrupt", "/cluster-state/coordination/", True, _flip, True),
    # written once at bootstrap and shared by every manifest since (found by the fault simulator,
    # seeds 23 and 25: every manifest unreadable, "no committed, complete cluster state")
    ("customs entity corrupt", "/cluster-state/customs/", True, _flip, True),
    ("settings entity deleted", "/cluster-state/settings/", True, _delete, True),
    ("templates entity truncated", "/cluster-state/templates/", True, _truncate, True),
    ("newest index entity deleted", "/cluster-state/index/", True, _delete, True),
    ("newest index-list chunk deleted", "/cluster-state/chunk/", True, _delete, True),
]


@pytest.mark.parametrize(("name", "part", "newest", "fault", "must_recover"), CASES, ids=[c[0] for c in CASES])
def test_one_bad_blob_restores_everything_or_refuses_naming_it(golden, tmp_path, name, part, newest, fault,
                                                               must_recover):
    remote = tmp_path / "remote"
    shutil.copytree(golden, remote)
    victim = _pick(_keys(remote), part, newest)
    fault(remote / victim)
    try:
        restored = Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "fresh"), nodes=1)
    except RestoreDataLoss as exc:
        assert not must_recover, f"{name}: refused although nothing is truly lost: {exc}"
        # refused: the error names the blob at fault and the missing range
        assert exc.losses, exc
        text = str(exc)
        assert "seq#" in text and "accept_data_loss=True" in text, text
        assert victim.rsplit("/", 1)[-1] in text or victim.rsplit("/", 2)[-2] in text, (victim, text)
        # accepting the loss restores the rest and says exactly what was dropped
        accepted = Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "accepted"), nodes=1,
                                   accept_data_loss=True)
        try:
            accepted.refresh("docs")
            dropped = sum(hi - lo + 1 for loss in accepted.restore_losses for lo, hi in loss.missing)
            assert dropped >= 1
            assert accepted.count("docs") >= N - dropped
        finally:
            accepted.close()
        return
    except ShardstoreError as exc:
        assert not must_recover, f"{name}: refused although nothing is truly lost: {exc!r}"
        # any other refusal must at least name the blob at fault
        assert victim.rsplit("/", 1)[-1] in str(exc), (victim, repr(exc))
        return
    try:
        restored.refresh("docs")
        assert restored.count("docs") == N, f"{name}: {restored.count('docs')} of {N} acknowledged docs restored"
        docs = restored.scan("docs", columns=["_id", "r"]).to_pylist()
        assert sorted((int(d["_id"]), d["r"]) for d in docs) == [(i, i // PER_ROUND) for i in range(N)]
        assert restored.restore_losses == []
    finally:
        restored.close()


def test_a_segment_file_every_commit_shares_is_named_when_it_is_lost(tmp_path: Path) -> None:
    """One segment file, referenced by every retained commit (the later flushes added only deletes of absent
    ids), and the translog under it purged: truncating it loses seq# 0-11 for real.  The refusal must name the file;
    it said "no blob was found damaged" (every commit refused, and why each was, was dropped; found by the
    fault simulator, seed 5111)."""
    remote = tmp_path / "remote"
    cluster = Cluster(store=f"file://{remote}", data_dir=str(tmp_path / "nodes"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "r": 0} for i in range(10)]).errors
        for k in range(3):
            cluster.flush("docs")
            # a delete of an id that does not exist: a new seq# (so the next flush is not skipped as unchanged,
            # engine/shard/flush_policy.py, and moves the translog's purge gate) and no new segment file
            cluster.delete("docs", f"absent-{k}")
        cluster.flush("docs")
    finally:
        cluster.close()
    victim = _pick(_keys(remote), "/segments/data/")
    assert len([k for k in _keys(remote) if "/segments/data/" in k]) == 1
    _truncate(remote / victim)
    with pytest.raises(RestoreDataLoss) as info:
        Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "fresh"), nodes=1)
    text = str(info.value)
    # the 10 documents (seq# 0-9) and the two deletes the purged translog held (10-11): every commit names the file
    assert "seq# 0-11" in text and victim.rsplit("/", 1)[-1] in text, text


@pytest.mark.parametrize("later_writes", [True, False], ids=["later-writes", "no-later-writes"])
@pytest.mark.parametrize(("part", "fault"), [("/segments/metadata/", _delete), ("/segments/metadata/", _flip),
                                             ("/segments/data/", _flip), ("/segments/data/", _truncate)])
def test_a_shards_only_commit_lost_is_refused_naming_it(tmp_path: Path, part: str, fault: Callable[[Path], None],
                                                         later_writes: bool) -> None:
    """Issue 31: a new shard's first commit covers its translog (there is no commit to fall back to, and keeping
    it stored the shard twice: engine/shard/flush_policy.py, ``remote_purge_gate``).  So one lost or corrupt blob of
    that commit truly loses its operations: the restore must refuse, naming the blob and seq# 0-19, and with
    ``accept_data_loss`` bring back the 20 documents acknowledged after it.

    ``no-later-writes``: nothing was written after the flush, so the purge left no translog operation at all, only
    the translog metadata's global checkpoint (19).  A deleted commit metadata blob then restored an empty shard
    without a word (fault simulator, seed 9614: 15 acknowledged writes lost)."""
    remote = tmp_path / "remote"
    cluster = Cluster(store=f"file://{remote}", data_dir=str(tmp_path / "nodes"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "r": 0} for i in range(20)]).errors
        cluster.flush("docs")
        if later_writes:
            assert not cluster.bulk("docs", [{"_id": str(i), "r": 1} for i in range(20, 40)]).errors
    finally:
        cluster.close()
    victim = _pick(_keys(remote), part)
    fault(remote / victim)
    with pytest.raises(RestoreDataLoss) as info:
        Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "fresh"), nodes=1)
    text = str(info.value)
    # a deleted blob leaves no name to read: its place is named (the commit metadata prefix), else the blob itself
    named = victim.rsplit("/", 1)[0] + "/" if fault is _delete else victim.rsplit("/", 1)[-1]
    assert "seq# 0-19" in text and named in text, text
    accepted = Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "accepted"), nodes=1,
                               accept_data_loss=True)
    try:
        accepted.refresh("docs")
        kept = 20 if later_writes else 0
        assert accepted.count("docs") == kept
        # the loss was accepted: the writes after it re-use the dropped seq#s, and a later restore must not refuse
        # them for the old history's global checkpoint (capped by the accepting primary's trim)
        assert not accepted.bulk("docs", [{"_id": f"new-{i}", "r": 2} for i in range(5)]).errors
    finally:
        accepted.close()
    again = Cluster.restore(store=f"file://{remote}", data_dir=str(tmp_path / "again"), nodes=1)
    try:
        again.refresh("docs")
        assert again.count("docs") == kept + 5
    finally:
        again.close()
