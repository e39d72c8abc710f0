"""Network partitions between node processes: one TCP fault proxy per directed link (issue 41).

:class:`LinkedCluster` starts a :class:`~shardstore.engine.launcher.ProcessCluster` whose
nodes reach each other only through a :class:`~shardstore.testing.tcp_proxy.TcpFaultProxy`
per ordered pair (node ``a`` reaches ``b`` at ``proxy(a, b)``: ``--peer-addresses`` and
``--seed-hosts`` point there), so a link can be cut on its own: an isolated node, a bridge
(``a``-``c`` cut, both still reach ``b``), or one direction only.  Clients still reach every
node directly, as a client beside the cut-off node would.

Two ways to cut, as the partition campaign of issue 41 did:

- ``"blackhole"``: bytes are dropped, connections stay open; calls time out (packets dropped);
- ``"down"``: live connections are reset and new ones refused (the link is gone).

``heal()`` restores every link.  A test tool: no library package imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shardstore.engine.launcher import ProcessCluster, free_port
from shardstore.testing.tcp_proxy import TcpFaultProxy
from shardstore.transport import partition_links

__all__ = ["CUT_MODES", "LinkedCluster"]

CUT_MODES = ("blackhole", "down")


class LinkedCluster:
    """N node processes whose every directed link runs through its own fault proxy (see the module docstring)."""

    def __init__(self, root: str, store: str, nodes: int = 3, **options: Any) -> None:
        self.names = [f"n{i + 1}" for i in range(nodes)]
        ports = {n: free_port() for n in self.names}
        self.proxies: dict[tuple[str, str], TcpFaultProxy] = {}
        try:
            for a in self.names:
                for b in self.names:
                    if a != b:
                        self.proxies[(a, b)] = TcpFaultProxy(f"127.0.0.1:{ports[b]}").start()
            peers = {a: [b for b in self.names if b != a] for a in self.names}
            node_args = {a: ["--peer-addresses", ",".join(f"{b}={self.proxies[(a, b)].address}" for b in peers[a])]
                         for a in self.names}
            seeds = {a: ",".join(self.proxies[(a, b)].address for b in peers[a]) for a in self.names}
            self.cluster = ProcessCluster(root, store, nodes, listen={n: f"127.0.0.1:{p}" for n, p in ports.items()},
                                          node_args=node_args, seeds=seeds, **options)
        except BaseException:
            self._stop_proxies()
            raise
        self.cut_links: set[tuple[str, str]] = set()

    # -- faults -----------------------------------------------------------------------------------------

    def cut(self, a: str, b: str, *, mode: str = "blackhole", one_way: bool = False) -> None:
        """Cut the link ``a`` -> ``b`` (and ``b`` -> ``a`` unless ``one_way``): calls either side starts fail."""
        if mode not in CUT_MODES:
            raise ValueError(f"cut mode must be one of {CUT_MODES}, got {mode!r}")
        for link in [(a, b)] if one_way else [(a, b), (b, a)]:
            proxy = self.proxies[link]
            if mode == "blackhole":
                proxy.blackhole()
            else:
                proxy.refuse(True)
                proxy.reset_connections()
            self.cut_links.add(link)

    def isolate(self, node: str, *, mode: str = "blackhole") -> None:
        """Cut ``node`` off from every other node (both directions)."""
        self.split([node], mode=mode)

    def split(self, side: Iterable[str], *, mode: str = "blackhole") -> None:
        """Cut every link between ``side`` and the other nodes."""
        for a, b in partition_links(self.names, side):
            self.cut(a, b, mode=mode)

    def heal(self) -> None:
        """Every link forwards again (connections that lost bytes are reset, as TCP would drop them)."""
        for link in list(self.cut_links):
            proxy = self.proxies[link]
            proxy.refuse(False)
            proxy.heal()
        self.cut_links.clear()

    # -- the cluster ------------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """Everything else (kill, pause, client, logs...) is the process cluster's."""
        if name == "cluster":  # not built yet (a failed start)
            raise AttributeError(name)
        return getattr(self.cluster, name)

    def _stop_proxies(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()

    def close(self) -> None:
        """Kill every node process, then stop the proxies."""
        try:
            if "cluster" in self.__dict__:
                self.cluster.close()
        finally:
            self._stop_proxies()

    def __enter__(self) -> LinkedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
