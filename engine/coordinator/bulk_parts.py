"""One bulk's parts for several shards sent to each primary node at once (``shard.bulk_many``, issue 30).

A bulk over many shards used to cost one ``shard.bulk`` per shard, each waiting for its own
translog upload.  Grouping the parts by the node holding each shard's primary lets that node
stage them all before its upload round starts, so the bulk costs one round per node.  The
pieces here are the wire shape of a part's result and the grouping; the routers
(``Coordinator``) send, and the nodes (``node_service``) answer.

A part's result is ``{"ops": stamped}`` or ``{"error": "Type: message", "retry": bool}``;
``retry`` is true only when nothing of the part was applied (no primary there), so the
router may send that part again through the one-shard path, which waits out a failover.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardstore.core.ops import index_fields
from shardstore.engine.errors import NodeDisconnected, ShardUnavailable, WriteNotAcknowledged
from shardstore.engine.shard.request_ledger import Applied
from shardstore.engine.shard.shard_copy import ShardCopy
from shardstore.engine.shard.staging import ColumnarPart, Staged, stage_columnar, takes_columnar
from shardstore.errors import LocalDiskError


class PartFailed(Exception):
    """One part of a multi-shard bulk failed on its node (the message is the node's ``Type: message``)."""


def part_failure(exc: BaseException) -> dict[str, Any]:
    """The result of a part that failed with ``exc``."""
    return {"error": f"{type(exc).__name__}: {exc}", "retry": isinstance(exc, ShardUnavailable)}


def closed_under(key: Key, copy: ShardCopy, exc: BaseException) -> BaseException:
    """``exc``, or a WriteNotAcknowledged in its place when ``copy`` was closed under the write (failed and dropped
    by another thread, its node stopping): then ``exc`` is the close's ("the translog is closed"), not an answer,
    and the client gets a typed one it may retry by id (as engine/shard/local_disk.py gives a write, seed 1367)."""
    if not copy.closed or isinstance(exc, ShardUnavailable | WriteNotAcknowledged | LocalDiskError):
        return exc
    typed = WriteNotAcknowledged(key[0], key[1], f"its copy at {copy.path} was closed during the write "
                                                 f"({type(exc).__name__}: {exc})")
    typed.__cause__ = exc
    return typed


@contextlib.contextmanager
def typed_if_closed(key: Key, copy: ShardCopy) -> Any:
    """Raise what the block raised, through :func:`closed_under`."""
    try:
        yield
    except Exception as exc:
        typed = closed_under(key, copy, exc)
        if typed is exc:
            raise
        raise typed  # noqa: B904 - closed_under set its cause


def group_by_node(shards: Sequence[int], primary_of: Callable[[int], str | None]) -> dict[str | None, list[int]]:
    """Positions of ``shards`` grouped by the node holding each one's primary (None: no primary now)."""
    groups: dict[str | None, list[int]] = {}
    for i, s in enumerate(shards):
        groups.setdefault(primary_of(s), []).append(i)
    return groups


Key = tuple[str, int]


@dataclass(frozen=True)
class NodeRoles:
    """What :func:`apply_one` and :func:`apply_parts` need of a node (the embedded ``Node`` or a process's
    ``NodeService``)."""

    lock: Callable[[Key], contextlib.AbstractContextManager[Any]]  # the shard's write lock
    #: the part's primary copy here; ShardUnavailable if none, or if it failed before (reported off this path)
    primary: Callable[[dict[str, Any]], ShardCopy]
    hold: Callable[[list[Key]], contextlib.AbstractContextManager[Any]]  # the node's upload-round hold
    join: Callable[[Key], contextlib.AbstractContextManager[Any]]  # ask the next round to wait for a one-shard bulk
    #: to the shard's in-sync copies (key, copy, stamped, mapping, checkpoints out, request id)
    replicate: Callable[[Key, ShardCopy, pa.RecordBatch, Any, list[int], str | None], None]
    #: a retried request's first attempt made durable here and on every in-sync copy, else ShardUnavailable
    confirm: Callable[[Key, ShardCopy, Applied], None]
    settle: Callable[[Key, ShardCopy, Any], None]  # wait for the part's upload (a disk failure reported)
    disk_failed: Callable[[Key, ShardCopy, LocalDiskError], None]
    mapping: Callable[[Any], Any]  # the part's mapping as the copy takes it
    reply: Callable[[pa.RecordBatch], pa.RecordBatch]  # what of the stamped batch goes back


def apply_one(req: dict[str, Any], key: Key, node: NodeRoles, expect: tuple | None = None, *,
              stage: Callable[[ShardCopy], tuple[pa.RecordBatch, Any]] | None = None,
              reply: Callable[[pa.RecordBatch], Any] | None = None) -> Any:
    """A node's side of ``shard.bulk``: stage and replicate under the shard's lock (replicas get a shard's bulks
    in order), then wait for the upload without it; what :attr:`NodeRoles.reply` keeps of the stamped batch.

    The bulk holds the node's ``join`` from before it queues on the lock until it is staged, so
    concurrent bulks of the shard share an upload round (``NodeTranslog.joining``).  ``stage(copy)``: another
    write staged the same way (``shard.adopt``: ``ShardCopy.adopt``), ``reply`` what it answers.
    """
    stage = stage or (lambda copy: copy.primary_stage(req["ops"], expect=expect, mapping=node.mapping(
        req.get("mapping")), fields=req.get("fields")))
    reply = reply or node.reply
    checkpoints: list[int] = []
    request = req.get("request")
    with contextlib.ExitStack() as joined:
        joined.enter_context(node.join(key))  # before the lock: queued bulks join the next round
        with node.lock(key):
            copy = node.primary(req)
            first = copy.requests.get(request)  # a retry: its first attempt is in this copy's history
            if first is None:
                try:
                    with typed_if_closed(key, copy):
                        try:
                            stamped, pending = stage(copy)
                        finally:
                            joined.close()  # staged: the round may start without waiting for this bulk any more
                        copy.requests.record(request, stamped, pending)
                        copy.replicate_staged(stamped, pending, lambda st: node.replicate(
                            key, copy, st, req.get("mapping"), checkpoints, request))
                except LocalDiskError as exc:
                    node.disk_failed(key, copy, exc)  # a replica takes over; the client retries
                    raise
    if first is not None:  # applied once already: its outcome, once it is as durable as an acknowledgement
        node.confirm(key, copy, first)
        return first.reply  # what the ledger kept: the reply's columns, or an adopted run's summary
    with typed_if_closed(key, copy):
        node.settle(key, copy, pending)
    copy.update_global_checkpoint(min([copy.local_checkpoint, *checkpoints]))
    return reply(stamped)


def apply_parts(parts: Sequence[dict[str, Any]], node: NodeRoles) -> list[dict[str, Any]]:
    """A node's side of ``shard.bulk_many``: every part staged inside one hold of the node's upload round, each
    replicated, then (the shard locks released) each settled; per part ``{"ops"}`` or :func:`part_failure`."""
    results: list[dict[str, Any] | None] = [None] * len(parts)
    staged: list[tuple[int, Key, ShardCopy, pa.RecordBatch, Any, list[int]]] = []
    keys = sorted({(str(p["index_uuid"]), int(p["shard"])) for p in parts})
    replicated = []
    retried: list[tuple[int, Key, ShardCopy, Applied]] = []
    with contextlib.ExitStack() as held:
        for k in keys:
            held.enter_context(node.lock(k))
        with node.hold(keys):
            copies: list[ShardCopy | None] = [None] * len(parts)
            mappings = [node.mapping(part.get("mapping")) for part in parts]
            for i, part in enumerate(parts):
                try:
                    copy = node.primary(part)
                except Exception as exc:  # noqa: BLE001 - reported for this part only
                    results[i] = part_failure(exc)
                    continue
                first = copy.requests.get(part.get("request"))
                if first is not None:  # a retried part applied once already: confirmed below, not staged
                    retried.append((i, (str(part["index_uuid"]), int(part["shard"])), copy, first))
                else:
                    copies[i] = copy
            together = _stage_together(parts, copies, mappings)
            for i, part in enumerate(parts):
                copy = copies[i]
                if copy is None:
                    continue
                key = (str(part["index_uuid"]), int(part["shard"]))
                try:
                    done = together.get(i)
                    if isinstance(done, BaseException):
                        raise done
                    stamped, pending = done if done is not None else copy.primary_stage(
                        part["ops"], mapping=mappings[i], fields=part.get("fields"))
                except Exception as exc:  # noqa: BLE001 - reported for this part only
                    if isinstance(exc, LocalDiskError):
                        node.disk_failed(key, copy, exc)
                    results[i] = part_failure(closed_under(key, copy, exc))
                    continue
                copy.requests.record(part.get("request"), stamped, pending)
                staged.append((i, key, copy, stamped, pending, []))
        for i, key, copy, stamped, pending, checkpoints in staged:
            wire = parts[i].get("mapping")
            try:
                copy.replicate_staged(stamped, pending, lambda st, k=key, c=copy, m=wire, cp=checkpoints,
                                      r=parts[i].get("request"): node.replicate(k, c, st, m, cp, r))
            except Exception as exc:  # noqa: BLE001 - reported for this part only
                results[i] = part_failure(closed_under(key, copy, exc))
                continue
            replicated.append((i, key, copy, stamped, pending, checkpoints))
    for i, key, copy, stamped, pending, checkpoints in replicated:
        try:
            node.settle(key, copy, pending)
        except Exception as exc:  # noqa: BLE001 - reported for this part only
            results[i] = part_failure(closed_under(key, copy, exc))
            continue
        copy.update_global_checkpoint(min([copy.local_checkpoint, *checkpoints]))
        results[i] = {"ops": node.reply(stamped)}
    for i, key, copy, first in retried:
        try:
            node.confirm(key, copy, first)
        except Exception as exc:  # noqa: BLE001 - reported for this part only (retried again by its sender)
            results[i] = part_failure(exc)
            continue
        results[i] = {"ops": first.reply}
    return results  # type: ignore[return-value]


def _stage_together(parts: Sequence[dict[str, Any]], copies: Sequence[ShardCopy | None], mappings: list[Any]
                    ) -> dict[int, Staged | BaseException | None]:
    """The parts that may be staged in one columnar pass (engine/shard/staging.py), staged: by position, (stamped,
    pending) or the part's error; a part not there (or None) goes through the one-part path."""
    # the parsed fields come as the operations' fields column (engine/coordinator/role.py _fields_to_send)
    fields = [p.get("fields") if p.get("fields") is not None else index_fields(p["ops"]) for p in parts]
    chosen = [i for i, copy in enumerate(copies) if copy is not None and mappings[i] is not None
              and takes_columnar(copy, parts[i]["ops"], fields[i], mappings[i])]
    chosen = [i for i in chosen if mappings[i] == mappings[chosen[0]]]  # one mapping per pass (one bulk's)
    if len(chosen) < 2:
        return {}
    done = stage_columnar([ColumnarPart(copies[i], parts[i]["ops"], fields[i])  # type: ignore[arg-type]
                           for i in chosen], mappings[chosen[0]])
    return dict(zip(chosen, done, strict=True))


def staging_hold(remote: Any, copies: dict[Key, ShardCopy], keys: list[Key]) -> contextlib.AbstractContextManager[Any]:
    """Hold the node's upload round (``remote``: its NodeRemote, or None) while a bulk's parts are staged."""
    first = next((copies[k] for k in keys if k in copies), None)
    if remote is None or first is None:
        return contextlib.nullcontext()
    return remote.staging(first.spec.cluster_uuid)


def joining_hold(remote: Any, copies: dict[Key, ShardCopy], key: Key) -> contextlib.AbstractContextManager[Any]:
    """Ask the node's next upload round to take a one-shard bulk still waiting for ``key``'s lock (group commit
    of concurrent clients, ``NodeTranslog.joining``); released once the bulk is staged."""
    copy = copies.get(key)
    if remote is None or copy is None or copy.node_remote is None:
        return contextlib.nullcontext()
    return remote.joining(copy.spec.cluster_uuid)


def unsent(exc: BaseException) -> bool:
    """Whether a failed ``shard.bulk_many`` certainly applied nothing (its parts may go again one by one)."""
    return isinstance(exc, ShardUnavailable) or (isinstance(exc, NodeDisconnected) and exc.delivered is False)


def take_answers(positions: list[int], answer: list[dict[str, Any]], out: list[Any],
                 again: Callable[[int], Any], acked: Callable[[int, pa.RecordBatch], None] | None = None) -> None:
    """Fill ``out`` at ``positions`` from a node's per-part results: the stamped batch, the part sent again
    through the one-shard path (``again``) when nothing was applied, else :class:`PartFailed`."""
    for i, result in zip(positions, answer, strict=True):
        if result.get("ops") is not None:
            if acked is not None:
                acked(i, result["ops"])
            out[i] = result["ops"]
        elif result.get("retry"):
            out[i] = again(i)
        else:
            out[i] = PartFailed(result["error"])


__all__ = ["NodeRoles", "PartFailed", "apply_one", "apply_parts", "group_by_node", "joining_hold", "part_failure", "staging_hold",
           "take_answers", "unsent"]
