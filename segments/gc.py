"""Which segment files and commit-metadata blobs may be deleted: pure decisions, listings in.

Nothing here does I/O.  The remote caller LISTs its shard's commit-metadata blobs and
segment file blobs (under every term's prefix, see :mod:`shardstore.core.path_strategy`),
passes them with the locks it knows and the files it is uploading, and deletes what
:func:`plan_remote_gc` returns.  The local shard directory uses :func:`retained_commits`
and :func:`local_deletable` the same way.

Rules (seed 001; the remote store is written by one primary per term, but a deposed
primary of an older term -- a *zombie* -- may keep uploading under its own term):

1. **Order.**  Commits are ordered by ``(primary_term, generation)`` (then ``key``, for
   determinism).  A newer term's commit is newer than *any* older term's commit, whatever
   its generation: a zombie's high generation never outranks the new primary.
2. **Stale primary.**  If any listed commit or file -- or ``marker_term``, the newest
   term-marker the caller listed (:func:`shardstore.core.path_strategy.latest_term`)
   -- has a term above ``caller_term``, the caller is no longer the primary: the plan is
   empty (``GcPlan.newer_term`` says which term it saw) and it must not GC at all.
   Hence nothing of a term newer than the caller's is ever deleted.  Pass
   ``marker_term``: a new primary writes its marker before anything else, so without
   it a zombie can GC in the window before the new primary's first upload and delete
   files of the commit the new primary adopted (see the tests).
2b. **No commit of its own yet.**  While no listed commit has ``caller_term``, the plan
   is empty (``GcPlan.blocked`` says why): the newest commit still belongs to an older
   term whose zombie may yet extend it, and deleting that zombie's unreferenced files
   could leave the newest commit incomplete.  A new primary uploads first, GCs after.
3. **Retained commits** are the newest ``max(keep_last, 1)`` commits plus every listed
   commit whose key is in ``locked`` (reader leases, snapshots).  A commit is deletable
   iff it is not retained.  The newest commit is therefore never deleted.
4. **Referenced files.**  A file referenced by a retained commit is never deletable
   (locked commits are retained, so their files are kept too).
5. **In flight.**  A file in ``in_flight`` (being uploaded for a commit not yet written)
   is never deletable.
6. **Unreferenced files** -- listed, of a term <= ``caller_term``, referenced by no
   retained commit and not in flight -- are deletable, whether of the caller's own term
   or of an older one (a zombie's orphans, files only deleted commits named).

7. **Older terms, early** (``drop_older_terms_after=k``).  Once the caller's own term
   has ``k`` (>= 1) listed commits, older terms' commits are no longer among the
   retained newest (locked ones still are): after a failover, the old term's copy of the
   shard goes as soon as the new term has ``k`` commits to fall back on, instead of
   after ``keep_last`` newer commits.  Rules 2 and 2b still hold: only the newest term
   does it, and only once it has a commit of its own.

Consequences the tests check on simulated histories: every file of the newest commit of
the newest term stays; a GC by an older-term primary deletes nothing; a GC's plan never
holds a file some retained or locked commit names.

What the caller must guarantee (the plan is only as good as its inputs):

- ``in_flight`` holds every file the caller uploaded (or is uploading) that no commit in
  ``commits`` names yet -- list commits *after* files, or pause uploads while planning;
- ``commits`` lists every commit-metadata blob of the shard, of every term;
- it lists the term markers first, then commits, then files, and a new primary writes
  its marker before it reads the newest commit it adopts; it only reuses older-term
  remote files named by that commit (anything else it uploads under its own term);
- a reader takes its lock *before* it reads a commit's files, or reads only the newest
  commit (which no GC deletes); a lock taken after the LIST protects from the next GC on.

A zombie may still write a commit after a GC deleted files it names: such a commit is
of an older term than the newest and may be incomplete; readers use the newest commit
of the newest term (or a locked one), never an older term's commit found by listing.

Local shard directory: :func:`retained_commits` picks the commit generations to keep
(same keep-last-plus-locked rule) and :func:`local_deletable` is
``on_disk - files of retained commits - open_files``.  Each retained commit's file set
must include its own commit point (``segments_N``); ``open_files`` must include every
file open by a reader, being written (flushes, merges not yet committed, the write lock)
or being uploaded to the remote store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardstore.errors import InvalidError


@dataclass(frozen=True, slots=True)
class RemoteCommitRef:
    """One listed remote commit-metadata blob and the store-root-relative file keys it names."""

    key: str
    primary_term: int
    generation: int
    files: frozenset[str]

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise InvalidError(f"a commit key must be a non-empty str, got {self.key!r}")
        for name in ("primary_term", "generation"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidError(f"commit {self.key!r}: {name} must be an int >= 0, got {v!r}")
        if not isinstance(self.files, frozenset) or not all(isinstance(f, str) and f for f in self.files):
            raise InvalidError(f"commit {self.key!r}: files must be a frozenset of non-empty str")

    @property
    def order(self) -> tuple[int, int, str]:
        """Sort key: (primary_term, generation, key); larger is newer."""
        return (self.primary_term, self.generation, self.key)


@dataclass(frozen=True, slots=True)
class RemoteFileRef:
    """One listed remote segment-file blob and the primary term whose prefix it lives under."""

    key: str
    primary_term: int

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise InvalidError(f"a file key must be a non-empty str, got {self.key!r}")
        t = self.primary_term
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidError(f"file {self.key!r}: primary_term must be an int >= 0, got {t!r}")


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What to delete (file and commit-metadata keys); ``blocked`` says why a plan is empty by rule 2/2b."""

    files: frozenset[str] = frozenset()
    commits: frozenset[str] = frozenset()
    newer_term: int | None = None
    blocked: str | None = None

    @property
    def is_empty(self) -> bool:
        """Whether there is nothing to delete."""
        return not self.files and not self.commits


def _check_keep_last(keep_last: object) -> int:
    if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0:
        raise InvalidError(f"keep_last must be an int >= 0, got {keep_last!r}")
    return max(keep_last, 1)


def _str_set(name: str, values: Iterable[str]) -> frozenset[str]:
    if isinstance(values, str):
        raise InvalidError(f"{name} must be a collection of str, not a str")
    out = frozenset(values)
    if not all(isinstance(v, str) for v in out):
        raise InvalidError(f"{name} must hold str only")
    return out


def sort_commits(commits: Iterable[RemoteCommitRef]) -> list[RemoteCommitRef]:
    """The commits oldest first by (primary_term, generation, key); duplicate keys are InvalidError."""
    out = sorted(commits, key=lambda c: c.order)
    seen: set[str] = set()
    for c in out:
        if not isinstance(c, RemoteCommitRef):
            raise InvalidError(f"expected RemoteCommitRef, got {c!r}")
        if c.key in seen:
            raise InvalidError(f"commit {c.key!r} is listed twice")
        seen.add(c.key)
    return out


def retained_remote_commits(
    commits: Iterable[RemoteCommitRef], *, keep_last: int = 10, locked: Iterable[str] = frozenset()
) -> frozenset[str]:
    """Keys of the commits to keep: the newest ``max(keep_last, 1)`` plus the locked ones."""
    n = _check_keep_last(keep_last)
    locks = _str_set("locked", locked)
    ordered = sort_commits(commits)
    return frozenset(c.key for c in ordered[-n:]) | frozenset(c.key for c in ordered if c.key in locks)


def plan_remote_gc(
    commits: Iterable[RemoteCommitRef],
    files: Iterable[RemoteFileRef],
    *,
    caller_term: int,
    keep_last: int = 10,
    locked: Iterable[str] = frozenset(),
    in_flight: Iterable[str] = frozenset(),
    marker_term: int | None = None,
    drop_older_terms_after: int | None = None,
) -> GcPlan:
    """The remote files and commits the primary of ``caller_term`` may delete (rules 1-7)."""
    if not isinstance(caller_term, int) or isinstance(caller_term, bool) or caller_term < 0:
        raise InvalidError(f"caller_term must be an int >= 0, got {caller_term!r}")
    if marker_term is not None and (
        not isinstance(marker_term, int) or isinstance(marker_term, bool) or marker_term < 0
    ):
        raise InvalidError(f"marker_term must be None or an int >= 0, got {marker_term!r}")
    n = _check_keep_last(keep_last)
    locks = _str_set("locked", locked)
    flying = _str_set("in_flight", in_flight)
    ordered = sort_commits(commits)
    file_terms: dict[str, int] = {}
    for f in files:
        if not isinstance(f, RemoteFileRef):
            raise InvalidError(f"expected RemoteFileRef, got {f!r}")
        if file_terms.setdefault(f.key, f.primary_term) != f.primary_term:
            raise InvalidError(f"file {f.key!r} is listed under terms {file_terms[f.key]} and {f.primary_term}")

    seen = [c.primary_term for c in ordered] + list(file_terms.values())
    newest = max(seen + ([] if marker_term is None else [marker_term]), default=-1)
    if newest > caller_term:  # rule 2: a stale primary must not GC
        return GcPlan(newer_term=newest, blocked=f"stale primary: term {newest} exists above {caller_term}")
    if not any(c.primary_term == caller_term for c in ordered):  # rule 2b
        return GcPlan(blocked=f"no commit of term {caller_term} yet")

    newest_n = ordered[-n:]
    own = [c for c in ordered if c.primary_term == caller_term]
    if drop_older_terms_after is not None and len(own) >= max(1, drop_older_terms_after):  # rule 7
        newest_n = [c for c in newest_n if c.primary_term == caller_term]
    retained = newest_n + [c for c in ordered if c.key in locks and c not in newest_n]
    retained_keys = frozenset(c.key for c in retained)
    referenced = frozenset().union(*(c.files for c in retained))
    dead_commits = frozenset(c.key for c in ordered if c.key not in retained_keys)
    dead_files = frozenset(k for k in file_terms if k not in referenced and k not in flying)
    return GcPlan(files=dead_files, commits=dead_commits)


def retained_commits(generations: Sequence[int], keep_last: int, locked: Iterable[int]) -> frozenset[int]:
    """Local commit generations to keep: the newest ``max(keep_last, 1)`` plus the locked ones listed."""
    n = _check_keep_last(keep_last)
    gens = list(generations)
    for g in gens:
        if not isinstance(g, int) or isinstance(g, bool) or g < 0:
            raise InvalidError(f"a generation must be an int >= 0, got {g!r}")
    if len(set(gens)) != len(gens):
        raise InvalidError(f"a generation is listed twice: {sorted(gens)}")
    locks = frozenset(locked)
    ordered = sorted(gens)
    return frozenset(ordered[-n:]) | (locks & frozenset(gens))


def local_deletable(
    on_disk: Iterable[str], retained_commit_files: Iterable[frozenset[str]], open_files: Iterable[str]
) -> frozenset[str]:
    """Local files no retained commit names and nobody has open: on_disk - referenced - open."""
    disk = _str_set("on_disk", on_disk)
    opened = _str_set("open_files", open_files)
    referenced: set[str] = set()
    for files in retained_commit_files:
        referenced |= _str_set("retained_commit_files", files)
    return disk - referenced - opened


__all__ = [
    "GcPlan",
    "RemoteCommitRef",
    "RemoteFileRef",
    "local_deletable",
    "plan_remote_gc",
    "retained_commits",
    "retained_remote_commits",
    "sort_commits",
]
