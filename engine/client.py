"""A client of a cluster of node processes: ``shardstore.connect("h1:9400,h2:9400")`` (issue 29).

:class:`Client` has the document API of the embedded ``Cluster`` (``create_index``,
``bulk``, ``index_doc``, ``delete``, ``get``, ``scan``, ``count``, ``refresh``, ``flush``,
``health``, ``wait_for_health``, ``primary_of``).  It holds no routing and no
document logic of its own: every call is a ``client.*`` action to one node, whose
coordinator runs the one document API (:class:`~shardstore.engine.coordinator.documents.Documents`).

A call that did not reach a node (``NodeDisconnected.delivered`` False: the node is
down) is sent to the next host; so is a read whose answer was lost.  Every write carries
a request id (this client's id and a counter): one whose answer was lost (its node died,
a link was cut: it may have been applied) is sent again under the same id through the
failover, and applied once (engine/shard/request_ledger.py).  Only when the retries run
out (``retry_wait``) does a bulk report its items as not acknowledged, and a
single-document call raise the ``NodeDisconnected``.
"""

from __future__ import annotations

import itertools
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingABC
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from shardstore.engine.coordinator.documents import BulkResult
from shardstore.engine.coordinator.routing import shard_id
from shardstore.engine.coordinator.validation import check_doc_id
from shardstore.engine.errors import HealthTimeout, InvalidRequest, NodeNotReady, NoNodeReachable
from shardstore.engine.manager.allocation import ClusterHealth
from shardstore.errors import ShardstoreError, UnavailableError
from shardstore.net.flight import ANY_NODE, FlightTransport
from shardstore.net.security import Security, TransportAuthError
from shardstore.transport import NodeDisconnected

#: seconds a client trusts its copy of an index's routing (a moved primary still answers, one hop slower)
ROUTING_TTL = 1.0
_RANK = {"red": 0, "yellow": 1, "green": 2}
_WRITES = frozenset({"client.bulk", "client.index_doc", "client.delete", "client.create_index", "client.ingest"})
#: seconds ``connect()`` waits for the first answer of any host (a wrong address fails fast, not at the first call)
CONNECT_TIMEOUT = 1.5
#: seconds a write whose outcome is unknown is sent again under its request id (through a failover)
RETRY_WAIT = 30.0
#: how long one ``ingest`` call may take (a coordinator applies every staged row before it answers)
INGEST_TIMEOUT = 3600.0


#: clients of the clusters this process runs (embedded ``Cluster``), by store location: how a writer in this process
#: (a Spark driver) reaches the cluster serving a store whose nodes have no network address
_IN_PROCESS: weakref.WeakValueDictionary[str, Client] = weakref.WeakValueDictionary()


def in_process_client(location: str) -> Client | None:
    """The client of the cluster this process runs on the store at ``location``, or None."""
    return _IN_PROCESS.get(location)


def serve_in_process(location: str, client: Client, running: bool = True) -> None:
    """Name ``client`` the in-process client of the store at ``location`` (``running=False``: no longer)."""
    if running:
        _IN_PROCESS[location] = client
    elif _IN_PROCESS.get(location) is client:
        del _IN_PROCESS[location]


def _check_index(index: object) -> str:
    """``index`` if it is a string (the coordinator checks the rest of the name), else InvalidRequest."""
    if not isinstance(index, str):
        raise InvalidRequest(f"an index name is a string, got {type(index).__name__}")
    return index


class Client:
    """The document API over the network (see the module docstring)."""

    def __init__(self, hosts: str | Iterable[str], *, security: Security | None = None,
                 timeout: float = 60.0, ready_wait: float = 15.0, transport: Any = None) -> None:
        """Reach the cluster at ``hosts`` over Arrow Flight, or over ``transport`` (a
        :class:`~shardstore.net.local_link.LocalLink`: nodes embedded in this process, where a host is a name)."""
        addresses = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts) if h.strip()]
        if not addresses:
            raise InvalidRequest("connect() needs at least one host:port")
        self._transport = transport if transport is not None else FlightTransport(security=security,
                                                                                  default_timeout=timeout)
        self._hosts = [f"{ANY_NODE}{a}" for a in addresses]
        for name, address in zip(self._hosts, addresses):
            self._transport.set_peer(name, address)
        self._next = 0
        #: how long a call waits out an election (every host answering NodeNotReady)
        self.ready_wait = ready_wait
        self._known = set(self._hosts)
        self._routing: dict[str, dict[str, Any]] = {}  # index -> shard count and primaries' addresses
        #: this client's id and the counter naming its writes ``writer:n``: a write whose answer was lost is sent
        #: again under its name, and whichever primary gets it answers the first attempt's outcome if it was
        #: applied (engine/shard/request_ledger.py; docs/design/engine.md, "Writes retried exactly once")
        self.writer = uuid.uuid4().hex
        self._sequence = itertools.count(1)
        #: how long a write whose outcome is unknown is sent again (a failover: detection, promotion, resync)
        self.retry_wait = RETRY_WAIT

    def _request_id(self) -> str:
        """A new write's name, unique over every client."""
        return f"{self.writer}:{next(self._sequence)}"

    def _call(self, action: str, request: dict[str, Any], timeout: float | None = None) -> Any:
        """Send to one host after the other; while every reachable host is between managers (an election,
        ``NodeNotReady``: nothing applied) try them all again, for up to ``ready_wait`` seconds.

        A write named by a request id whose answer was lost (its node died or was cut off: it may have been
        applied) is sent again under the same id, for up to ``retry_wait`` seconds: it is applied once.  A
        write without one is never sent twice.
        """
        named = action in _WRITES and bool(request.get("request"))
        deadline = time.monotonic() + (max(self.ready_wait, self.retry_wait) if named else self.ready_wait)
        while True:
            last: NodeDisconnected | NodeNotReady | None = None
            again: ShardstoreError | None = None
            for i in range(len(self._hosts)):
                host = self._hosts[(self._next + i) % len(self._hosts)]
                try:
                    answer = self._transport.send("client", host, action, request, timeout=timeout)
                    self._next = (self._next + i) % len(self._hosts)
                    return answer
                except NodeDisconnected as exc:
                    if exc.delivered is not False and action in _WRITES:
                        if not named:
                            raise  # it may have been applied, and no id tells: never sent twice
                        again = exc
                    last = exc
                except NodeNotReady as exc:  # it just started, or its manager is being elected
                    last = again = exc
            assert last is not None
            if again is None or time.monotonic() >= deadline:
                raise last
            time.sleep(0.05)

    def cluster(self) -> dict[str, Any]:
        """Health, nodes and shard copies as an operator reads them (``shardstore cluster``; see
        engine/coordinator/cluster_view.py for the keys)."""
        return self._call("client.cluster", {})

    def probe(self, timeout: float = CONNECT_TIMEOUT) -> dict[str, str | None]:
        """Ask every host at once who it is; {node name: the manager it follows (None: none yet)} of those that
        answered, NoNodeReachable naming every address and its cause when none did within ``timeout``."""
        def hello(host: str) -> tuple[str, Any]:
            try:
                return host, self._transport.send("client", host, "discovery.hello", {}, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - every cause is named in the error
                return host, exc
        with ThreadPoolExecutor(max_workers=min(16, len(self._hosts))) as pool:
            answers = list(pool.map(hello, self._hosts))
        seen = {a["name"]: a.get("master") for _, a in answers if isinstance(a, dict)}
        if not seen:
            refused = [a for _, a in answers if isinstance(a, TransportAuthError)]
            if len(refused) == len(answers):
                raise refused[0]  # every node answered, and refused these credentials: that is the cause to fix
            raise NoNodeReachable({h[len(ANY_NODE):]: _short(a, h[len(ANY_NODE):]) for h, a in answers}, timeout)
        return seen

    def create_index(self, name: str, shards: int = 1, replicas: int = 1, mappings: dict | None = None,
                     durability: str = "request", source: str = "stored", *, wait: float | None = 120.0) -> str:
        """Create an index (through the elected cluster manager); its UUID once it is allocated.

        Returns once every shard has its primary and the replicas the data nodes can hold are in
        sync (HealthTimeout after ``wait`` seconds; ``wait=None``: at once).
        """
        uuid = self._call("client.create_index", {"name": name, "shards": shards, "replicas": replicas,
                                                  "mappings": mappings, "durability": durability,
                                                  "source": source})["uuid"]
        if wait is not None:
            self.wait_for_allocation(name, timeout=wait)
        return uuid

    def bulk(self, index: str, docs: pa.Table | Iterable[MappingABC[str, Any]]) -> BulkResult:
        """Index documents; per-item results (a lost answer: every item not acknowledged, with the reason)."""
        _check_index(index)
        if isinstance(docs, pa.RecordBatch):
            docs = pa.Table.from_batches([docs])
        if isinstance(docs, (str, bytes, MappingABC)):
            raise InvalidRequest(f"a bulk is a list of documents (dicts), got one {type(docs).__name__}")
        if not isinstance(docs, pa.Table) and not isinstance(docs, Iterable):
            raise InvalidRequest(f"a bulk is a list of documents (dicts) or an Arrow table, got {type(docs).__name__}")
        # a document that is not a mapping is refused per item by the coordinator's door (engine/coordinator/validation.py)
        payload = docs if isinstance(docs, pa.Table) else [dict(d) if isinstance(d, MappingABC) else d for d in docs]
        try:
            return BulkResult(self._call("client.bulk", {"index": index, "docs": payload,
                                                         "request": self._request_id()}))
        except NodeDisconnected as exc:
            ids = payload.column("_id").cast(pa.string()) if isinstance(payload, pa.Table) else \
                pa.array([str(d.get("_id")) for d in payload], pa.string())
            n = len(ids)
            return BulkResult(pa.table({
                "_id": ids, "shard": pa.nulls(n, pa.int32()), "seq_no": pa.nulls(n, pa.int64()),
                "primary_term": pa.nulls(n, pa.int64()), "version": pa.nulls(n, pa.int64()),
                "error": pa.repeat(pa.scalar(f"NodeDisconnected: {exc}", pa.string()), n),
                "item": pa.array(range(n), pa.int64())}))

    def ingest_prefix(self, index: str, job: str) -> str:
        """Where ingest job ``job`` of ``index`` stages its files and its record (engine/coordinator/ingest_job.py)."""
        return self._call("client.ingest_prefix", {"index": _check_index(index), "job": job})

    def ingest(self, index: str, job: str, *, timeout: float = INGEST_TIMEOUT) -> dict[str, Any]:
        """Apply ingest job ``job`` (files staged and its record written under :meth:`ingest_prefix`) once.

        Its outcome: ``rows``, ``applied``, ``deleted`` and ``replayed`` (another commit of the job recorded the
        outcome first: this call applied nothing, or, running at the same time, the same rows again), and ``seconds``
        (this call's phases: ``check``, ``hold``, ``apply``, ``release``, ``total``).  IngestIncomplete: not every row
        was acknowledged; calling again applies the job whole.
        """
        return self._call("client.ingest", {"index": _check_index(index), "job": job}, timeout=timeout)

    def index_doc(self, index: str, doc: MappingABC[str, Any], *, if_seq_no: int | None = None,
                  if_primary_term: int | None = None) -> BulkResult:
        """Index one document with optimistic concurrency."""
        _check_index(index)
        if not isinstance(doc, MappingABC):
            raise InvalidRequest(f"a document is a dict, got {type(doc).__name__}")
        return BulkResult(self._call("client.index_doc", {"index": index, "doc": dict(doc), "if_seq_no": if_seq_no,
                                                          "if_primary_term": if_primary_term,
                                                          "request": self._request_id()}))

    def delete(self, index: str, doc_id: str, *, if_seq_no: int | None = None,
               if_primary_term: int | None = None) -> BulkResult:
        """Delete one document."""
        _check_index(index)
        return BulkResult(self._call("client.delete", {"index": index, "id": doc_id, "if_seq_no": if_seq_no,
                                                       "if_primary_term": if_primary_term,
                                                       "request": self._request_id()}))

    def get(self, index: str, doc_id: str) -> dict[str, Any] | None:
        """The document (realtime, from its primary), or None.

        Sent straight to the node holding the shard's primary (the client keeps each index's
        routing, one ``client.routing`` call, and follows it as it changes): one round trip,
        no hop between nodes.  Any failure there falls back to a node that routes it.
        """
        _check_index(index)
        request = {"index": index, "id": doc_id}
        node = self._primary_node(index, doc_id)
        if node is not None:
            try:
                return self._transport.send("client", node, "client.get", request)
            except ShardstoreError:
                self._routing.pop(index, None)  # moved, or gone: asked again next time
        return self._call("client.get", request)

    def _primary_node(self, index: str, doc_id: str) -> str | None:
        """The peer name of the node holding the primary of ``doc_id``'s shard (routing cached), or None."""
        check_doc_id(doc_id)
        routing = self._routing.get(index)
        if routing is None or time.monotonic() - routing["at"] > ROUTING_TTL:
            try:
                routing = {**self._call("client.routing", {"index": index}), "at": time.monotonic()}
            except ShardstoreError:
                return None
            self._routing[index] = routing
        shard = shard_id(doc_id, routing["shards"])
        address = routing["primaries"][shard]
        if address is None:
            return None
        name = f"{ANY_NODE}{address}"
        if name not in self._known:
            self._transport.set_peer(name, address)
            self._known.add(name)
        return name

    def refresh(self, index: str) -> None:
        """Make every copy's buffered documents searchable."""
        self._call("client.refresh", {"index": _check_index(index)})

    def flush(self, index: str) -> None:
        """Commit every copy; primaries upload their commit."""
        self._call("client.flush", {"index": _check_index(index)})

    def count(self, index: str) -> int:
        """Searchable live documents, over the primaries."""
        return int(self._call("client.count", {"index": _check_index(index)}))

    def scan(self, index: str, columns: list[str] | None = None) -> pa.Table:
        """Every searchable live document of the primaries (as of their last refresh) as ONE ``pyarrow.Table``.

        Iterating the table yields its columns; for rows use ``table.to_pylist()`` (dicts) or ``table.to_batches()``.
        ``columns`` picks fields (``_id`` and ``_source`` included by name); writes since the last ``refresh`` are
        not in it (``get`` by id sees them)."""
        return self._call("client.scan", {"index": _check_index(index), "columns": columns})

    def index_uuid(self, index: str) -> str:
        """The UUID of ``index`` (IndexNotFound)."""
        return self._call("client.index_uuid", {"index": _check_index(index)})

    def index_mapping(self, index: str) -> dict[str, Any]:
        """``{"shards": n, "mapping": {...}}``: the index's shard count and its mapping as it stands (IndexNotFound)."""
        return self._call("client.index_mapping", {"index": _check_index(index)})

    def primary_of(self, index: str, shard: int) -> str | None:
        """The node holding the shard's primary (None while it has none)."""
        return self._call("client.primary_of", {"index": _check_index(index), "shard": shard})

    def health(self, index: str | None = None) -> ClusterHealth:
        """The cluster manager's health of the cluster (or one index): green, yellow or red, with shard counts."""
        d = self._call("client.health", {} if index is None else {"index": _check_index(index)})
        return ClusterHealth(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def wait_for_health(self, status: str = "green", timeout: float = 120.0) -> ClusterHealth:
        """Block until health is at least ``status``; HealthTimeout names what is missing (and when green needs
        more data nodes than are members)."""
        if status not in _RANK or status == "red":
            raise InvalidRequest(f"wait_for_health status must be 'yellow' or 'green', not {status!r}")
        return self._wait(lambda h: _RANK[h.status] >= _RANK[status], f"health {status}", timeout)

    def wait_for_allocation(self, index: str | None = None, timeout: float = 120.0) -> ClusterHealth:
        """Block until every shard (of ``index``, or of all) has its primary and the replicas the data nodes can
        hold in sync, none recovering (HealthTimeout)."""
        return self._wait(lambda h: h.settled, "allocation", timeout, index=index)

    def _wait(self, done: Callable[[ClusterHealth], bool], what: str, timeout: float, *,
              index: str | None = None) -> ClusterHealth:
        """Poll health until ``done``; HealthTimeout after ``timeout``; elections waited out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                h: Any = self.health(index)
                if done(h):
                    return h
            except UnavailableError as exc:  # an election, every node restarting, a red index: waited out
                h = exc
            if time.monotonic() >= deadline:
                short = "" if getattr(h, "green_possible", True) else \
                    f" (green needs more than the {h.data_nodes} data nodes that are members)"
                raise HealthTimeout(f"{what}{'' if index is None else f' of index {index!r}'}: not reached after "
                                    f"{timeout}s{short}: {_missing(h)}")
            time.sleep(0.02)

    def close(self) -> None:
        """Drop the connections."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _missing(h: Any) -> str:
    """What a health wait still waits for, in words (or the last error when no health answered)."""
    if not isinstance(h, ClusterHealth):
        return f"no health answered: {_short(h) if isinstance(h, BaseException) else h}"
    parts = [f"status {h.status}", f"{h.data_nodes} data node(s)"]
    if h.red_shards:
        parts.append(f"{len(h.red_shards)} shard(s) without a primary ({', '.join(h.red_shards[:5])})")
    if h.unassigned_shards:
        parts.append(f"{h.unassigned_shards} copy(ies) unassigned")
    if h.initializing_shards:
        parts.append(f"{h.initializing_shards} recovering")
    return "; ".join(parts) + (f"; causes: {' '.join(h.causes)}" if h.causes else "") + f" [{h}]"


def _short(exc: BaseException, address: str = "") -> str:
    """One line of a connection failure: its kind and first sentence (gRPC's texts run to 300 characters), without
    the address the caller names already."""
    text = str(exc).split(";")[0].split("\n")[0]
    if text.startswith("[") and "]" in text and ": " in text:  # "[action] a -> b: " names what the caller knows
        text = text.split(": ", 1)[1]
    if address and text.startswith(f"{address} "):
        text = text[len(address) + 1:]
    if len(text) > 160:
        text = text[:160].rsplit(" ", 1)[0] + " ..."  # cut at a word, and say so
    return f"{type(exc).__name__}: {text}"


def connect(hosts: str | Iterable[str], *, security: Security | None = None, timeout: float = 60.0,
            connect_timeout: float | None = CONNECT_TIMEOUT) -> Client:
    """A :class:`Client` of the cluster reachable at ``hosts`` (``"h1:9400,h2:9400"``).

    Fails fast: NoNodeReachable, naming every address and its cause, when no host answers within
    ``connect_timeout`` seconds (``None``: no check, the first call finds out).
    """
    client = Client(hosts, security=security, timeout=timeout)
    if connect_timeout is not None:
        try:
            client.probe(connect_timeout)
        except BaseException:
            client.close()
            raise
    return client
