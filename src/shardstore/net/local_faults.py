"""Process faults on the in-process transport: pauses, partitions and dead nodes, by node name (issue 42).

Node processes are paused with SIGSTOP and cut apart by TCP fault proxies
(:class:`~shardstore.testing.partitions.LinkedCluster`).  Nodes that share one Python
process over the in-process :class:`~shardstore.transport.Transport` get the same faults
from its message rules, and :class:`LocalFaults` names them the same way:

- ``pause(name)`` / ``resume(name)``: every message to or from the node hangs until its
  caller's timeout (its port accepts, it answers nothing), then flows again;
- ``cut(a, b, mode=, one_way=)``, ``isolate``, ``split``, ``heal``: a partition per directed
  link, ``"down"`` (refused at once) or ``"blackhole"`` (calls hang until their timeout),
  the request and its response alike (a call in flight loses its answer too);
- ``dead(name)`` / ``revived(name)``: what a killed node had sent and a delay still holds is
  never delivered, even once a new run of it is up (a SIGKILLed process's sockets die with it);
- ``clear_faults()``: remove every other rule a caller installed on the transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from shardstore.transport import InvalidTransportRequest, NodeDisconnected, Rule, Transport, partition_links

#: how long a paused node's or a blackholed link's messages hang: longer than any caller waits
HANG_SECONDS = 3600.0
#: how a partition cuts a link (as shardstore.testing.partitions.CUT_MODES)
CUT_MODES = ("blackhole", "down")


class LocalFaults:
    """Pauses, partitions and dead nodes on one in-process transport (see the module docstring)."""

    def __init__(self, transport: Transport, names: Callable[[], list[str]]) -> None:
        """Faults on ``transport`` among the nodes ``names()`` lists (read at each partition)."""
        self.transport = transport
        self._names = names
        self._paused: dict[str, list[Rule]] = {}
        self._cuts: list[Rule] = []
        self._dead: dict[str, Rule] = {}
        self._lock = threading.Lock()

    def pause(self, name: str) -> None:
        """As a SIGSTOP: every message to or from the node hangs until its caller's timeout."""
        with self._lock:
            if name not in self._paused:
                self._paused[name] = [self.transport.delay(HANG_SECONDS, target=name),
                                      self.transport.delay(HANG_SECONDS, sender=name)]

    def resume(self, name: str) -> None:
        """As a SIGCONT: the node's messages flow again."""
        with self._lock:
            rules = self._paused.pop(name, [])
        for rule in rules:
            rule.remove()

    def dead(self, name: str) -> None:
        """The node was killed: nothing it sent is delivered from now on (a held message included)."""
        with self._lock:
            if name not in self._dead:
                self._dead[name] = self.transport.on("*", _dropped, sender=name)

    def revived(self, name: str) -> None:
        """A new run of the node is up: its messages are delivered again."""
        with self._lock:
            rule = self._dead.pop(name, None)
        if rule is not None:
            rule.remove()

    def cut(self, a: str, b: str, *, mode: str = "blackhole", one_way: bool = False) -> None:
        """Cut the link ``a`` -> ``b`` (and ``b`` -> ``a`` unless ``one_way``), at once or at the callers' timeout."""
        if mode not in CUT_MODES:
            raise InvalidTransportRequest(f"cut mode must be one of {CUT_MODES}, got {mode!r}")
        rules = []
        for sender, target in [(a, b)] if one_way else [(a, b), (b, a)]:
            for direction in ("request", "response"):
                if mode == "down":
                    rules.append(self.transport.drop(sender=sender, target=target, direction=direction))
                else:
                    rules.append(self.transport.delay(HANG_SECONDS, sender=sender, target=target, direction=direction))
        with self._lock:
            self._cuts.extend(rules)

    def isolate(self, name: str, *, mode: str = "blackhole") -> None:
        """Cut ``name`` off from every other node (both directions)."""
        self.split([name], mode=mode)

    def split(self, side: Iterable[str], *, mode: str = "blackhole") -> None:
        """Cut every link between ``side`` and the other nodes."""
        for a, b in partition_links(self._names(), side):
            self.cut(a, b, mode=mode)

    def heal(self) -> None:
        """Every cut link carries messages again (paused nodes stay paused)."""
        with self._lock:
            cuts, self._cuts = self._cuts, []
        for rule in cuts:
            rule.remove()

    def clear_faults(self) -> None:
        """Remove the transport's partitions and every rule a caller installed (pauses, cuts, dead nodes stay)."""
        with self._lock:
            owned = {id(r) for r in [*self._cuts, *self._dead.values(), *(r for rs in self._paused.values() for r in rs)]}
        self.transport.heal()
        for rule in self.transport.rules():
            if id(rule) not in owned:
                rule.remove()


def _dropped(sender: str, target: str, action: str, _request: Any) -> None:
    raise NodeDisconnected(sender, target, action, f"{sender} was killed", delivered=False)
