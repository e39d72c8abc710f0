"""The production node roles, N of them in one Python process over the in-process transport (issue 42).

:class:`EmbeddedNodes` starts N :class:`~shardstore.engine.node.process.NodeProcess` instances,
exactly the roles a ``shardstore node`` process runs (data, cluster manager, coordinator,
fault detection, discovery, elections), each over a
:class:`~shardstore.net.local_link.LocalLink` to one shared
:class:`~shardstore.transport.Transport` and one shared blob store.  It drives them as
:class:`~shardstore.engine.launcher.ProcessCluster` drives processes, with the same method
names, so a test or a simulator schedule runs on either:

- ``kill(name)``: the node's link is severed at once (every message from or to it fails, as
  after a SIGKILL), then its roles are stopped without a flush;
- ``pause(name)`` / ``resume(name)``: every message to or from the node hangs until the
  caller's timeout (a SIGSTOPped process: its port accepts, it answers nothing); unlike a
  real pause its own threads keep running, but none of them gets an answer from a peer;
- ``stop(name)``: a clean shutdown (flush, leave the cluster);
- ``restart(name)``: the roles again on the node's data directory, as a new member;
- ``cut`` / ``isolate`` / ``split`` / ``heal``: partitions per directed link, ``"down"`` (refused at
  once) or ``"blackhole"`` (calls hang until their timeout), as :class:`~shardstore.testing.partitions.LinkedCluster`.

``client()`` is the network client (:class:`~shardstore.engine.client.Client`) over the same
transport.  Fault detection's intervals are settings (``fd``), short by default so that a
failover takes well under a second of fault detection.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.engine.client import Client
from shardstore.engine.errors import InvalidRequest
from shardstore.engine.node.fault_detection import FaultDetectionSettings
from shardstore.engine.node.process import ROLES, NodeProcess, NodeSettings
from shardstore.net.local_link import LocalLink
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.transport import NodeDisconnected, Rule, Transport, partition_links

#: fault detection of embedded nodes: a silent peer is found in 3 * (0.1 + 0.4) = 1.5 s
EMBEDDED_FD = FaultDetectionSettings(interval=0.1, timeout=0.4, retries=3)
#: how long a paused node's or a blackholed link's messages hang: longer than any caller waits
_PAUSED_SECONDS = 3600.0
#: how a partition cuts a link (as shardstore.testing.partitions.CUT_MODES)
CUT_MODES = ("blackhole", "down")


class EmbeddedNodes:
    """N production node roles in this process (see the module docstring)."""

    def __init__(self, root: str, store: str | BlobStore, nodes: int = 3, *, fd: FaultDetectionSettings = EMBEDDED_FD,
                 recovery_delay: float = 0.2, request_timeout: float = 30.0, transport: Transport | None = None,
                 names: list[str] | None = None, managers: int = 0, index_buffer_bytes: int = INDEX_BUFFER_BYTES,
                 accept_data_loss: bool = False, **store_options: Any) -> None:
        if nodes < 1:
            raise InvalidRequest(f"a cluster needs at least one node, got nodes={nodes}")
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.store = open_store(store, **store_options) if isinstance(store, str) else store
        self.transport = transport or Transport()
        self.names = list(names) if names is not None else [f"n{i + 1}" for i in range(nodes)]
        if len(self.names) != nodes or len(set(self.names)) != nodes:
            raise InvalidRequest(f"{nodes} nodes need {nodes} distinct names, got {self.names}")
        #: with ``managers``: dedicated cluster-manager nodes ``cm-0..`` (no copies) and data-only nodes
        self.managers = [f"cm-{i}" for i in range(managers)]
        self.names += self.managers
        self.index_buffer_bytes = index_buffer_bytes
        self.accept_data_loss = accept_data_loss
        self.fd = fd
        self.recovery_delay = recovery_delay
        self.request_timeout = request_timeout
        self.nodes: dict[str, NodeProcess] = {}
        self._links: dict[str, LocalLink] = {}
        self._paused: dict[str, list[Rule]] = {}
        self._cuts: list[Rule] = []
        self._dead: dict[str, Rule] = {}  # killed node -> the hook dropping what it sent before it died
        self._lock = threading.Lock()
        try:
            for name in self.names:
                self._start(name)
        except BaseException:
            self.close()
            raise

    def _settings(self, name: str) -> NodeSettings:
        if not self.managers:
            roles, eligible = ROLES, self.names
        else:
            roles = frozenset({"cluster_manager"}) if name in self.managers else frozenset({"data"})
            eligible = self.managers
        return NodeSettings(name=name, data_dir=os.path.join(self.root, name), store="embedded", listen=name,
                            seed_hosts=tuple(n for n in self.names if n != name), initial_managers=tuple(eligible),
                            roles=roles,
                            fault_detection=self.fd, recovery_delay=self.recovery_delay,
                            request_timeout=self.request_timeout, index_buffer_bytes=self.index_buffer_bytes,
                            accept_data_loss=self.accept_data_loss, nodes_per_process=len(self.names))

    def _start(self, name: str) -> NodeProcess:
        settings = self._settings(name)
        link = LocalLink(self.transport, default_timeout=self.request_timeout,
                         action_timeouts=settings.action_timeouts())
        node = NodeProcess(settings, transport=link, store=self.store)
        with self._lock:
            self.nodes[name] = node
            self._links[name] = link
        return node

    # -- faults ---------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """As a SIGKILL: no message from or to the node from now on, then its roles stop without a flush."""
        with self._lock:
            node = self.nodes.pop(name, None)
            link = self._links.pop(name, None)
        if node is None or link is None:
            self.resume(name)
            return
        link.sever()  # before the resume: a paused node handles nothing of what its pause held
        # what the dead node had sent and a delay still holds is never delivered, even once a new run of it is up
        self._dead[name] = self.transport.on("*", self._dropped, sender=name)
        self.resume(name)
        node.shutdown(clean=False)

    def pause(self, name: str) -> None:
        """As a SIGSTOP: every message to or from the node hangs until its caller's timeout."""
        if name in self._paused:
            return
        self._paused[name] = [self.transport.delay(_PAUSED_SECONDS, target=name),
                              self.transport.delay(_PAUSED_SECONDS, sender=name)]

    def resume(self, name: str) -> None:
        """As a SIGCONT: the node's messages flow again."""
        for rule in self._paused.pop(name, []):
            rule.remove()

    def stop(self, name: str, timeout: float = 60.0) -> int:
        """A clean shutdown (flush the primaries, leave the cluster); 0 as a process's exit status."""
        with self._lock:
            node = self.nodes.pop(name, None)
            self._links.pop(name, None)
        self.resume(name)
        if node is not None:
            node.shutdown(clean=True)
        return 0

    def restart(self, name: str) -> NodeProcess:
        """The node's roles again on its data directory (a new member, as a restarted process)."""
        if name in self.nodes:
            raise RuntimeError(f"node {name} is running; stop or kill it first")
        dead = self._dead.pop(name, None)
        if dead is not None:
            dead.remove()
        return self._start(name)

    @staticmethod
    def _dropped(sender: str, target: str, action: str, _request: Any) -> None:
        raise NodeDisconnected(sender, target, action, f"{sender} was killed", delivered=False)

    def cut(self, a: str, b: str, *, mode: str = "blackhole", one_way: bool = False) -> None:
        """Cut the link ``a`` -> ``b`` (and ``b`` -> ``a`` unless ``one_way``): calls either side starts fail,
        at once (``"down"``) or at their timeout (``"blackhole"``), as ``LinkedCluster.cut`` does over TCP."""
        if mode not in CUT_MODES:
            raise InvalidRequest(f"cut mode must be one of {CUT_MODES}, got {mode!r}")
        for sender, target in [(a, b)] if one_way else [(a, b), (b, a)]:
            for direction in ("request", "response"):  # a call in flight loses its answer too
                if mode == "down":
                    rule = self.transport.drop(sender=sender, target=target, direction=direction)
                else:
                    rule = self.transport.delay(_PAUSED_SECONDS, sender=sender, target=target, direction=direction)
                self._cuts.append(rule)

    def isolate(self, name: str, *, mode: str = "blackhole") -> None:
        """Cut ``name`` off from every other node (both directions)."""
        self.split([name], mode=mode)

    def split(self, side: Iterable[str], *, mode: str = "blackhole") -> None:
        """Cut every link between ``side`` and the other nodes."""
        for a, b in partition_links(self.names, side):
            self.cut(a, b, mode=mode)

    def heal(self) -> None:
        """Every cut link carries messages again (paused nodes stay paused)."""
        cuts, self._cuts = self._cuts, []
        for rule in cuts:
            rule.remove()

    def clear_faults(self) -> None:
        """Remove the transport's partitions and every drop, delay and hook a caller installed on it
        (this launcher's own pauses, cuts and dead nodes' hooks stay)."""
        with self._lock:
            owned = {id(r) for r in [*self._cuts, *self._dead.values(), *(r for rs in self._paused.values() for r in rs)]}
        self.transport.heal()
        for rule in self.transport.rules():
            if id(rule) not in owned:
                rule.remove()

    # -- access ---------------------------------------------------------------------------------------

    def live(self) -> list[str]:
        """Names of the nodes whose roles run."""
        with self._lock:
            return [n for n in self.names if n in self.nodes]

    def client(self, **options: Any) -> Client:
        """A client of every node (stopped ones are skipped at each call)."""
        return self.client_of(self.names, **options)

    def client_of(self, names: list[str], **options: Any) -> Client:
        """A client of the named nodes only."""
        return Client(names, transport=LocalLink(self.transport, default_timeout=options.pop("timeout", 60.0)),
                      **options)

    def call(self, name: str, action: str, request: Any, timeout: float = 30.0) -> Any:
        """Send one action straight to node ``name`` (what a stale router or a peer would send)."""
        return self.transport.send("test", name, action, request, timeout=timeout)

    def logs(self) -> str:
        """Nothing to read: the roles log through this process's ``logging``."""
        return ""

    def close(self) -> None:
        """Stop every node's roles without a flush."""
        for name in list(self.nodes):
            try:
                self.kill(name)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass

    def __enter__(self) -> EmbeddedNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
