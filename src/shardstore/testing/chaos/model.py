"""The client model of the engine simulator: what each id may hold now (issue 14); pure, no I/O.

Per id the model keeps the set of values that may be current (``None``: absent).  An
acknowledged write pins its value (``{v}``); a write that errored may or may not have
happened, so it adds its value to the set; an acknowledged delete pins ``None``.  Values are
unique per write, so an observed value tells exactly which write it came from.

:meth:`ClientModel.check` compares a read of the whole index with the model and returns the
violations: an acknowledged write lost, a deleted id back, a value no write produced, a
duplicate id, ``count`` unlike the scan, ``get`` unlike the scan.  Per-id seq#, term and
version of acknowledged writes must grow (checked as acknowledgements arrive).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    """One broken guarantee, with the step that revealed it."""

    kind: str  # lost | resurrected | foreign | duplicate | count | get | order | unclean | stuck
    step: int
    detail: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.kind}: {self.detail}"


@dataclass
class ClientModel:
    """What each id may hold (see the module docstring)."""

    possible: dict[str, set[str | None]] = field(default_factory=dict)
    acked: dict[str, str | None] = field(default_factory=dict)  # the last acknowledged outcome per id
    last_stamp: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # (term, seq#, version) acked
    written: set[str] = field(default_factory=set)  # every value any write carried

    def _may(self, doc_id: str) -> set[str | None]:
        return self.possible.setdefault(doc_id, {None})

    def acknowledged(self, doc_id: str, value: str | None) -> None:
        """A write (or delete, ``value=None``) of ``doc_id`` was acknowledged: it is current now."""
        if value is not None:
            self.written.add(value)
        self.possible[doc_id] = {value}
        self.acked[doc_id] = value

    def uncertain(self, doc_id: str, value: str | None) -> None:
        """A write of ``doc_id`` failed: it may or may not have happened."""
        if value is not None:
            self.written.add(value)
        self._may(doc_id).add(value)

    def stamp(self, doc_id: str, term: int, seq_no: int, version: int, step: int) -> Violation | None:
        """Record an acknowledged write's (term, seq#, version); a violation if it does not grow for the id."""
        new = (term, seq_no, version)
        old = self.last_stamp.get(doc_id)
        self.last_stamp[doc_id] = new
        if old is not None and (new[1] <= old[1] or new[0] < old[0]):
            return Violation("order", step, f"{doc_id}: acknowledged (term, seq#, version) {new} after {old}")
        return None

    def check(self, step: int, scan: Iterable[Mapping[str, object]], count: int,
              gets: Mapping[str, str | None]) -> list[Violation]:
        """Violations of a read: ``scan`` rows (``_id``, ``v``), ``count``, and ``gets`` (id -> value or None)."""
        out: list[Violation] = []
        seen: dict[str, str | None] = {}
        rows = 0
        for row in scan:
            rows += 1
            doc_id, value = str(row["_id"]), row.get("v")
            if doc_id in seen:
                out.append(Violation("duplicate", step, f"{doc_id} appears twice in the scan"))
            seen[doc_id] = None if value is None else str(value)
        if count != rows:
            out.append(Violation("count", step, f"count() is {count}, the scan has {rows} rows"))
        for doc_id in sorted(set(seen) | set(self.possible)):
            value = seen.get(doc_id)
            may = self.possible.get(doc_id, {None})
            if value not in may:
                out.append(Violation(self._kind(doc_id, value), step,
                                     f"{doc_id} is {value!r}, the model allows {sorted(may, key=str)}"))
            if doc_id in gets and gets[doc_id] != value:
                out.append(Violation("get", step, f"get({doc_id}) is {gets[doc_id]!r}, the scan has {value!r}"))
        return out

    def check_read(self, step: int, doc_id: str, value: str | None) -> Violation | None:
        """A read of one id between writes (a realtime ``get``): a violation unless its value is one the model allows."""
        may = self.possible.get(doc_id, {None})
        if value in may:
            return None
        return Violation(self._kind(doc_id, value), step,
                         f"get({doc_id}) is {value!r}, the model allows {sorted(may, key=str)}")

    def _kind(self, doc_id: str, value: str | None) -> str:
        if value is None:
            return "lost"
        if value not in self.written or not value.endswith(f":{doc_id}"):
            return "foreign"
        if doc_id in self.acked and self.acked[doc_id] is None:
            return "resurrected"
        return "lost"  # an older value back: the acknowledged one after it was lost


__all__ = ["ClientModel", "Violation"]
