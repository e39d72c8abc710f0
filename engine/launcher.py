"""Node processes on this machine: a local cluster for the drill, tests and benches (issue 29).

:class:`ProcessCluster` starts ``shardstore node`` processes (``python -m shardstore node``)
on ports the OS picks, each seeded with the first node's address, and drives them as a
user's operating system would: ``kill`` (SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT),
``stop`` (SIGTERM, a clean shutdown), ``restart`` on the same data directory.  A node's
output goes to ``<root>/<name>.log``.  ``client()`` connects to every live node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from shardstore.engine.client import Client, connect
from shardstore.net.flight import FlightTransport

#: how long a node process may take to print its address
START_TIMEOUT = 30.0


class NodeStartFailed(RuntimeError):
    """A node process exited or stayed silent before it listened; the message holds its log's tail."""


@dataclass
class NodeHandle:
    """One node process and how it was started."""

    name: str
    data_dir: str
    args: list[str]
    proc: subprocess.Popen | None = None
    address: str = ""  # where others reach it (its publish address)
    listen: str = ""  # where it listens
    log_path: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        """Whether its process is running (a paused one counts)."""
        return self.proc is not None and self.proc.poll() is None


class ProcessCluster:
    """N node processes over one store (see the module docstring)."""

    def __init__(self, root: str, store: str, nodes: int = 3, *, fd_interval: float = 0.5, fd_timeout: float = 1.0,
                 fd_retries: int = 3, store_options: dict[str, str] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 listen: dict[str, str] | None = None, publish: dict[str, str] | None = None,
                 node_args: dict[str, list[str]] | None = None, seeds: dict[str, str] | None = None) -> None:
        self.root = root
        self.store = store
        os.makedirs(root, exist_ok=True)
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.nodes: dict[str, NodeHandle] = {}
        self._common = ["--store", store, "--initial-managers", ",".join(self.names),
                        "--fd-interval", str(fd_interval), "--fd-timeout", str(fd_timeout),
                        "--fd-retries", str(fd_retries), "--log-level", "INFO",
                        *[a for k, v in (store_options or {}).items() for a in ("-o", f"{k}={v}")],
                        *(extra_args or [])]
        self._env = {**os.environ, **(env or {})}
        self._publish = dict(publish or {})  # name -> the address others reach it at (a proxy's)
        self._node_args = dict(node_args or {})  # name -> flags of that node only (e.g. --peer-addresses)
        self._seed_override = dict(seeds or {})  # name -> its --seed-hosts (default: the nodes started before it)
        try:
            for name in self.names:
                self._start(name, listen=(listen or {}).get(name, "127.0.0.1:0"))
        except BaseException:
            self.close()
            raise

    # -- processes ------------------------------------------------------------------------------------

    def _seeds(self, exclude: str) -> str:
        if exclude in self._seed_override:
            return self._seed_override[exclude]
        return ",".join(h.address for n, h in self.nodes.items() if n != exclude and h.address)

    def _start(self, name: str, listen: str) -> NodeHandle:
        data_dir = os.path.join(self.root, name)
        args = [sys.executable, "-m", "shardstore", "node", "--name", name, "--data-dir", data_dir,
                "--listen", listen, *self._common, *self._node_args.get(name, [])]
        seeds = self._seeds(name)
        if seeds:
            args += ["--seed-hosts", seeds]
        if name in self._publish:
            args += ["--publish", self._publish[name]]
        handle = self.nodes.get(name) or NodeHandle(name, data_dir, args, log_path=os.path.join(self.root,
                                                                                               f"{name}.log"))
        handle.args = args
        log = open(handle.log_path, "a")  # noqa: SIM115 - the child owns it from here
        log.write(f"--- start {time.strftime('%H:%M:%S')} {' '.join(args[1:])}\n")
        log.flush()
        handle.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=self._env, text=True)
        log.close()
        line = self._first_line(handle)
        handle.address = self._publish.get(name) or line.rsplit(" ", 1)[-1]
        handle.listen = line.rsplit(" ", 1)[-1]
        self.nodes[name] = handle
        return handle

    def _first_line(self, handle: NodeHandle) -> str:
        assert handle.proc is not None and handle.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        line = ""
        while time.monotonic() < deadline:
            line = handle.proc.stdout.readline()
            if line.startswith(f"node {handle.name} listening on "):
                return line.strip()
            if handle.proc.poll() is not None:
                break
        tail = open(handle.log_path).read()[-3000:]
        raise NodeStartFailed(f"node {handle.name} did not start ({line!r}, exit {handle.proc.poll()}):\n{tail}")

    def kill(self, name: str) -> None:
        """SIGKILL the node's process and reap it."""
        h = self.nodes[name]
        if h.alive:
            assert h.proc is not None
            h.proc.send_signal(signal.SIGCONT)  # a paused process dies too
            h.proc.kill()
            h.proc.wait(10)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process stays, its port accepts, it answers nothing."""
        assert self.nodes[name].proc is not None
        self.nodes[name].proc.send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a paused node."""
        assert self.nodes[name].proc is not None
        self.nodes[name].proc.send_signal(signal.SIGCONT)

    def dump_stacks(self) -> list[str]:
        """SIGUSR1 to every live node: each writes all its threads' stacks to its log and goes on; the names."""
        names = []
        for name, h in self.nodes.items():
            if h.alive and h.proc is not None:
                h.proc.send_signal(signal.SIGUSR1)
                names.append(name)
        return names

    def stop(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM (flush, leave, exit) and wait; the exit status."""
        h = self.nodes[name]
        assert h.proc is not None
        h.proc.send_signal(signal.SIGCONT)
        h.proc.terminate()
        return h.proc.wait(timeout)

    def restart(self, name: str) -> NodeHandle:
        """Start the node again on its data directory and its former port."""
        h = self.nodes[name]
        if h.alive:
            raise RuntimeError(f"node {name} is running; stop or kill it first")
        return self._start(name, listen=h.listen)

    def live(self) -> list[str]:
        """Names of the nodes whose process runs."""
        return [n for n, h in self.nodes.items() if h.alive]

    def client(self, names: list[str] | None = None, **options: Any) -> Client:
        """A client of every node started (dead ones are skipped at each call), or of ``names`` only."""
        return connect([self.nodes[n].address for n in names or self.nodes], **options)

    def call(self, name: str, action: str, request: Any, timeout: float = 30.0) -> Any:
        """Send one action straight to node ``name`` (what a stale router or a peer would send)."""
        transport = FlightTransport(default_timeout=timeout)
        try:
            transport.set_peer(name, self.nodes[name].address)
            return transport.send("test", name, action, request)
        finally:
            transport.close()

    def logs(self) -> str:
        """Every node's log, for a failing test's message."""
        return "\n".join(f"===== {n}\n{open(h.log_path).read()[-4000:]}" for n, h in self.nodes.items()
                         if os.path.exists(h.log_path))

    def close(self) -> None:
        """Kill every node process."""
        for name in list(self.nodes):
            try:
                self.kill(name)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
            h = self.nodes[name]
            if h.proc is not None and h.proc.stdout is not None:
                h.proc.stdout.close()


@contextmanager
def process_cluster(root: str, store: str, nodes: int = 3, **options: Any) -> Iterator[ProcessCluster]:
    """A :class:`ProcessCluster`, killed on exit."""
    cluster = ProcessCluster(root, store, nodes, **options)
    try:
        yield cluster
    finally:
        cluster.close()


#: ports :func:`free_port` picks from: below Linux's ephemeral range (32768-60999), which outgoing connections
#: take their local port from (a node restarted on a port in that range found it taken: chaos seeds 329, 346)
FIXED_PORTS = (20_000, 32_000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and no outgoing connection will take (for a node that
    keeps its port across restarts, e.g. behind a proxy)."""
    import random
    import socket

    for _ in range(200):
        port = random.randrange(*FIXED_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {FIXED_PORTS[0]}-{FIXED_PORTS[1]} after 200 tries")
