"""What an operator sees of a running cluster: health, nodes, shards (``shardstore cluster ...``, issue 45).

As Elasticsearch's ``_cat/health``, ``_cat/nodes`` and ``_cat/shards``: one screen each.  Any node's
coordinator answers ``client.cluster`` with :func:`build_view` over its applied cluster state and
what each member says it holds (``node.shards``, asked in parallel with a short timeout: a member
that does not answer is shown as such, never waited for).  Building the view and printing it are
pure functions of plain data (tested without a cluster); the view is plain JSON for scripts.

The view (``format_*`` read only these keys)::

    {"cluster_uuid", "manager", "term", "version", "answered_by",
     "nodes":   [{"name", "address", "manager", "answered", "error", "copies", "primaries", "docs", "bytes"}],
     "shards":  [{"index", "shard", "node", "role": "primary"|"replica"|"unassigned", "state", "term", "docs",
                  "bytes", "local_checkpoint", "global_checkpoint", "backlog"}],
     "health":  {ClusterHealth fields} or {"error": ...}}

``backlog``: operations of the copy above its last flush commit (what a restart replays from the
translog, and what keeps translog generations in the store).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardstore.engine.manager.metadata import IndexMeta


def build_view(*, cluster_uuid: str, manager: str | None, term: int, version: int, answered_by: str,
               nodes: Mapping[str, str], indices: Mapping[str, IndexMeta],
               held: Mapping[str, list[dict[str, Any]] | BaseException], health: dict[str, Any]) -> dict[str, Any]:
    """The cluster view (see the module docstring) from the applied state and each member's ``node.shards``."""
    by_uuid = {m.uuid: m.name for m in indices.values()}
    copies: dict[tuple[str, int, str], dict[str, Any]] = {}
    for node, answer in held.items():
        if isinstance(answer, BaseException):
            continue
        for c in answer:
            name = by_uuid.get(c["index_uuid"])
            if name is not None:
                copies[(name, int(c["shard"]), node)] = c
    shards: list[dict[str, Any]] = []
    for name in sorted(indices):
        meta = indices[name]
        for sr in meta.routing:
            routed = [*([sr.primary] if sr.primary else []), *(n for n in sr.copies if n != sr.primary)]
            for node in routed:
                c = copies.get((name, sr.shard, node))
                if isinstance(held.get(node), BaseException) or node not in held:
                    state = "no answer"
                elif c is None:
                    state = "missing"
                elif node not in sr.in_sync:
                    state = "recovering"
                else:
                    state = c.get("state", "started")
                shards.append({
                    "index": name, "shard": sr.shard, "node": node,
                    "role": "primary" if node == sr.primary else "replica", "state": state,
                    "term": sr.primary_term, "docs": None if c is None else c["docs"],
                    "bytes": None if c is None else c["bytes"],
                    "local_checkpoint": None if c is None else c["local_checkpoint"],
                    "global_checkpoint": None if c is None else c["global_checkpoint"],
                    "backlog": None if c is None else max(0, c["max_seq_no"] - c["committed_checkpoint"])})
            for i in range(max(0, 1 + meta.replicas - len(routed))):
                shards.append({"index": name, "shard": sr.shard, "node": None,
                               "role": "primary" if sr.primary is None and i == 0 else "replica",
                               "state": "unassigned", "term": sr.primary_term, "docs": None, "bytes": None,
                               "local_checkpoint": None, "global_checkpoint": None, "backlog": None})
    node_rows = []
    for node in sorted(nodes):
        answer = held.get(node)
        mine = [s for s in shards if s["node"] == node]
        node_rows.append({
            "name": node, "address": nodes[node], "manager": node == manager,
            "answered": node in held and not isinstance(answer, BaseException),
            "error": f"{type(answer).__name__}: {answer}" if isinstance(answer, BaseException) else None,
            "copies": len(mine), "primaries": sum(s["role"] == "primary" for s in mine),
            "docs": sum(s["docs"] or 0 for s in mine if s["role"] == "primary"),
            "bytes": sum(s["bytes"] or 0 for s in mine)})
    return {"cluster_uuid": cluster_uuid, "manager": manager, "term": term, "version": version,
            "answered_by": answered_by, "nodes": node_rows, "shards": shards, "health": health}


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, as ``_cat`` prints them."""
    cells = [[str(h) for h in header], *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _size(n: int | None) -> str | None:
    if n is None:
        return None
    for unit in ("b", "kb", "mb", "gb"):
        if n < 1024 or unit == "gb":
            return f"{n:.0f}{unit}" if unit == "b" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return None


def format_health(view: dict[str, Any]) -> str:
    """One line per cluster, as ``_cat/health``: status, nodes, shard counts, manager and term."""
    h = view["health"]
    if "error" in h:
        return f"health unknown: {h['error']} (manager {view['manager'] or 'none'}, term {view['term']})"
    row = [h["status"], len(view["nodes"]), h["data_nodes"], h["active_primaries"], h["active_shards"],
           h["initializing_shards"], h["unassigned_shards"], view["manager"] or "none", view["term"]]
    out = _table(["status", "nodes", "data", "pri", "shards", "init", "unassign", "manager", "term"], [row])
    for cause in h.get("causes") or ():
        out += f"\n  {cause}"
    return out


def format_nodes(view: dict[str, Any]) -> str:
    """One line per node, as ``_cat/nodes``: address, manager (*), copies, primaries, docs, bytes."""
    rows = [[n["name"], n["address"], "*" if n["manager"] else "-", "yes" if n["answered"] else "NO",
             n["copies"], n["primaries"], n["docs"], _size(n["bytes"])] for n in view["nodes"]]
    out = _table(["name", "address", "manager", "answers", "copies", "pri", "docs", "size"], rows)
    for n in view["nodes"]:
        if n["error"]:
            out += f"\n  {n['name']}: {n['error'][:200]}"
    return out


def format_shards(view: dict[str, Any]) -> str:
    """One line per shard copy, as ``_cat/shards``: index, shard, p/r, state, node, docs, size, translog backlog."""
    rows = [[s["index"], s["shard"], "p" if s["role"] == "primary" else "r", s["state"], s["node"], s["term"],
             s["docs"], _size(s["bytes"]), s["backlog"]] for s in view["shards"]]
    return _table(["index", "shard", "prirep", "state", "node", "term", "docs", "size", "backlog"], rows)


def to_json(view: dict[str, Any], what: str) -> str:
    """The part ``what`` (health, nodes, shards) of the view as JSON, for scripts."""
    part = {"health": {**view["health"], "manager": view["manager"], "term": view["term"],
                       "cluster_uuid": view["cluster_uuid"]},
            "nodes": view["nodes"], "shards": view["shards"]}[what]
    return json.dumps(part, indent=2, sort_keys=True, default=str)
