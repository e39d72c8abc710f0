"""In-process transport between the nodes of one cluster, with fault injection.

Nodes run in one process; each registers a handler ``handler(action, request) ->
response`` under its name.  :meth:`Transport.send` calls the target's handler in the
caller's thread and returns its response; an exception the handler raises propagates to
the caller unchanged.  Anything that stops a message raises :class:`NodeDisconnected`
instead, whose ``delivered`` attribute tells the two cases apart:

- ``delivered=False``: the request never reached the handler (unknown or unregistered
  target, partition, dropped or timed-out request); nothing was applied;
- ``delivered=True``: the handler ran but the response was lost (dropped response, a
  partition or the target's death while it handled the request, response timeout): the
  operation may have been applied.  Shard logic must treat it as unknown.

A network transport can replace this class later: shard logic only uses ``register``,
``unregister`` and ``send``.

Fault injection (all thread-safe, all removable):

- :meth:`partition` / :meth:`isolate` / :meth:`heal`: block both directions between
  groups of nodes (a node never is partitioned from itself);
- :meth:`drop`: lose requests or responses matching an action glob, a sender and a
  target, skipping the first ``after`` matches and firing at most ``times`` times, each
  with a ``probability`` drawn from a seeded per-rule random stream (deterministic for
  a given sequence of sends);
- :meth:`delay`: sleep before delivering a request or a response (bounded by ``timeout``); a
  delay taken out (``rule.remove()``, :meth:`clear_faults`) lets the messages it holds go on at once;
- :meth:`on`: run ``hook(sender, target, action, request)`` right before delivery, e.g.
  to kill the target mid-operation; a hook that raises aborts the send with its error.

Each call returns a :class:`Rule`; ``rule.remove()`` takes it out, ``rule.fired`` counts
its firings.  :meth:`stats` counts messages per action.

Order of one send: request drops, request delays, hooks, reachability check (registered,
not partitioned), handler, response drops, response delays, reachability check again.
"""

from __future__ import annotations

import fnmatch
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shardstore.errors import InvalidError, NotFoundError, ShardstoreError, UnavailableError


class TransportError(ShardstoreError):
    """Base of every transport error."""


class InvalidTransportRequest(TransportError, InvalidError):
    """A transport call is malformed (empty node name, handler not callable, bad fault rule); nothing changed."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid transport request: {reason}; nothing was applied")
        self.reason = reason


class NodeNotFound(TransportError, NotFoundError):
    """The node named is not part of the cluster; nothing was applied."""

    def __init__(self, node: str) -> None:
        super().__init__(f"no such node [{node}]; nothing was applied")
        self.node = node


class TransportClosed(TransportError):
    """This node's own transport is closed: the node was stopped (killed); nothing was sent, and no retry on this
    node can help (a retry loop must not catch it as it catches NodeDisconnected)."""

    def __init__(self, node: str, action: str) -> None:
        super().__init__(f"[{action}] {node} is stopped: its transport is closed; nothing was sent")
        self.node = node
        self.action = action


class NodeDisconnected(TransportError, UnavailableError):
    """The transport could not deliver a request, or its response, between two nodes.

    ``delivered`` is False when the request never reached the target (nothing was
    applied), True when the target handled it but the response was lost (it may have
    been applied: the ambiguous case), None when unknown (timeout).
    """

    def __init__(self, sender: str, target: str, action: str, reason: str, *, delivered: bool | None = False) -> None:
        if delivered is False:
            outcome = "the request was not delivered, nothing was applied"
        elif delivered:
            outcome = "the request was delivered but its response was lost; it may have been applied"
        else:
            outcome = "no response in time; the request may have been applied"
        super().__init__(f"[{action}] {sender} -> {target}: {reason}; {outcome}")
        self.sender = sender
        self.target = target
        self.action = action
        self.reason = reason
        self.delivered = delivered

def call_timeout(action: str, timeout: float | None, action_timeouts: dict[str, float],
                 default: float | None) -> float | None:
    """The deadline of one call: ``timeout``, else the first ``action_timeouts`` glob ``action`` matches, else
    ``default`` (every transport's rule, the in-process link's and Arrow Flight's)."""
    if timeout is not None:
        return timeout
    for glob, seconds in action_timeouts.items():
        if fnmatch.fnmatchcase(action, glob):
            return seconds
    return default


def partition_links(names: Iterable[str], side: Iterable[str]) -> list[tuple[str, str]]:
    """The node pairs (``a`` in ``side``, ``b`` not) a partition of ``side`` from the rest of ``names`` cuts."""
    side = set(side)
    return [(a, b) for a in sorted(side) for b in names if b not in side]


Handler = Callable[[str, Any], Any]
Hook = Callable[[str, str, str, Any], None]

_DIRECTIONS = ("request", "response")


def _names(value: str | Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset((value,))
    return frozenset(value)


@dataclass
class ActionStats:
    """Message counters of one action (a snapshot when returned by :meth:`Transport.stats`)."""

    sent: int = 0  # send() calls
    delivered: int = 0  # handler invoked
    responded: int = 0  # response (or handler error) handed back to the caller
    errors: int = 0  # handler raised (counted whether or not the error reached the caller)
    dropped_requests: int = 0
    dropped_responses: int = 0
    disconnected: int = 0  # NodeDisconnected raised to the caller, for any reason
    timed_out: int = 0


class Rule:
    """One injected fault (drop, delay or hook); matches by action glob, sender and target."""

    def __init__(
        self,
        transport: Transport,
        kind: str,
        action_glob: str,
        sender: str | Iterable[str] | None,
        target: str | Iterable[str] | None,
        times: int | None,
        after: int,
        direction: str,
        probability: float,
        rng: random.Random,
        seconds: float = 0.0,
        hook: Hook | None = None,
    ) -> None:
        if direction not in _DIRECTIONS:
            raise InvalidTransportRequest(f"direction must be one of {_DIRECTIONS}, not {direction!r}")
        if times is not None and times < 0:
            raise InvalidTransportRequest(f"times must be >= 0 or None, not {times}")
        if after < 0:
            raise InvalidTransportRequest(f"after must be >= 0, not {after}")
        if not 0.0 <= probability <= 1.0:
            raise InvalidTransportRequest(f"probability must be within [0, 1], not {probability}")
        if seconds < 0:
            raise InvalidTransportRequest(f"a delay must be >= 0 seconds, not {seconds}")
        self._transport = transport
        self.kind = kind
        self.action_glob = action_glob
        self.senders = _names(sender)
        self.targets = _names(target)
        self.times = times
        self.after = after
        self.direction = direction
        self.probability = probability
        self.seconds = seconds
        self.hook = hook
        self._rng = rng
        #: set once the rule is taken out: a message it holds (a delay) goes on at once
        self.removed = threading.Event()
        self.matched = 0  # messages that matched the filters (including those skipped by after/probability)
        self.fired = 0

    def matches(self, sender: str, target: str, action: str) -> bool:
        """Whether this rule applies to a message of ``action`` from ``sender`` to ``target``."""
        return (
            (self.senders is None or sender in self.senders)
            and (self.targets is None or target in self.targets)
            and fnmatch.fnmatchcase(action, self.action_glob)
        )

    def _fire(self) -> bool:
        """Count a match; True when the rule fires for it (the transport's lock is held)."""
        self.matched += 1
        if self.matched <= self.after:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        if self.probability < 1.0 and self._rng.random() >= self.probability:
            return False
        self.fired += 1
        return True

    @property
    def exhausted(self) -> bool:
        """Whether the rule has fired its ``times`` already."""
        return self.times is not None and self.fired >= self.times

    def remove(self) -> None:
        """Take the rule out of its transport (idempotent)."""
        self._transport._remove_rule(self)

    def __repr__(self) -> str:
        return (
            f"Rule({self.kind} {self.direction} {self.action_glob!r} sender={sorted(self.senders or [])} "
            f"target={sorted(self.targets or [])} fired={self.fired})"
        )


@dataclass
class _Partition:
    a: frozenset[str]
    b: frozenset[str] | None  # None: everyone but a (isolate)

    def blocks(self, x: str, y: str) -> bool:
        if x == y:
            return False
        if self.b is None:
            return (x in self.a) != (y in self.a)
        return (x in self.a and y in self.b) or (x in self.b and y in self.a)


@dataclass
class _Registration:
    handler: Handler
    token: object = field(default_factory=object)


class Transport:
    """In-process transport: named nodes, synchronous delivery, injectable faults."""

    def __init__(self, *, seed: int = 0, default_timeout: float | None = None) -> None:
        self._lock = threading.RLock()
        self._nodes: dict[str, _Registration] = {}
        self._partitions: list[_Partition] = []
        self._rules: list[Rule] = []
        self._stats: dict[str, ActionStats] = {}
        self._seed = seed
        self._rule_counter = 0
        self.default_timeout = default_timeout

    # -- nodes --------------------------------------------------------------------------------

    def register(self, node: str, handler: Handler) -> None:
        """Make ``node`` reachable; ``handler(action, request)`` answers its requests."""
        if not isinstance(node, str) or not node:
            raise InvalidTransportRequest(f"a node name must be a non-empty string, not {node!r}")
        if not callable(handler):
            raise InvalidTransportRequest(f"the handler of node {node!r} is not callable")
        with self._lock:
            if node in self._nodes:
                raise InvalidTransportRequest(f"node {node!r} is registered already (unregister it first)")
            self._nodes[node] = _Registration(handler)

    def unregister(self, node: str) -> None:
        """Make ``node`` unreachable (it died); requests it is handling lose their responses."""
        with self._lock:
            if self._nodes.pop(node, None) is None:
                raise NodeNotFound(node)

    def nodes(self) -> frozenset[str]:
        """The names of the registered nodes."""
        with self._lock:
            return frozenset(self._nodes)

    def is_registered(self, node: str) -> bool:
        """Whether ``node`` has a handler registered now."""
        with self._lock:
            return node in self._nodes

    # -- partitions -----------------------------------------------------------------------------

    def partition(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        """Block every message between a node of ``group_a`` and one of ``group_b`` (both ways)."""
        a, b = frozenset(group_a), frozenset(group_b)
        if a & b:
            raise InvalidTransportRequest(f"a partition's groups must be disjoint; both hold {sorted(a & b)}")
        with self._lock:
            self._partitions.append(_Partition(a, b))

    def isolate(self, node: str) -> None:
        """Block every message between ``node`` and any other node, registered now or later."""
        with self._lock:
            self._partitions.append(_Partition(frozenset((node,)), None))

    def heal(self) -> None:
        """Remove every partition (drops, delays and hooks stay)."""
        with self._lock:
            self._partitions.clear()

    def connected(self, x: str, y: str) -> bool:
        """True when no partition separates ``x`` and ``y`` (whether or not they are registered)."""
        with self._lock:
            return not any(p.blocks(x, y) for p in self._partitions)

    # -- rules ------------------------------------------------------------------------------------

    def _add_rule(self, kind: str, **kwargs: Any) -> Rule:
        with self._lock:
            self._rule_counter += 1
            rng = random.Random(f"{self._seed}/{self._rule_counter}")
            rule = Rule(self, kind, rng=rng, **kwargs)
            self._rules.append(rule)
            return rule

    def _remove_rule(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)
        rule.removed.set()

    def drop(
        self,
        action_glob: str = "*",
        sender: str | Iterable[str] | None = None,
        target: str | Iterable[str] | None = None,
        times: int | None = None,
        after: int = 0,
        direction: str = "request",
        probability: float = 1.0,
    ) -> Rule:
        """Lose matching requests (the handler does not run) or responses (it ran; the caller cannot know)."""
        return self._add_rule(
            "drop", action_glob=action_glob, sender=sender, target=target, times=times, after=after,
            direction=direction, probability=probability)

    def delay(
        self,
        seconds: float,
        action_glob: str = "*",
        sender: str | Iterable[str] | None = None,
        target: str | Iterable[str] | None = None,
        times: int | None = None,
        after: int = 0,
        direction: str = "request",
        probability: float = 1.0,
    ) -> Rule:
        """Sleep ``seconds`` before delivering matching requests (or handing back their responses)."""
        return self._add_rule(
            "delay", action_glob=action_glob, sender=sender, target=target, times=times, after=after,
            direction=direction, probability=probability, seconds=seconds)

    def on(
        self,
        action_glob: str,
        hook: Hook,
        *,
        sender: str | Iterable[str] | None = None,
        target: str | Iterable[str] | None = None,
        times: int | None = None,
        after: int = 0,
    ) -> Rule:
        """Run ``hook(sender, target, action, request)`` right before a matching request is delivered."""
        if not callable(hook):
            raise InvalidTransportRequest("a hook must be callable")
        return self._add_rule(
            "hook", action_glob=action_glob, sender=sender, target=target, times=times, after=after,
            direction="request", probability=1.0, hook=hook)

    def rules(self) -> list[Rule]:
        """The fault rules in force, oldest first."""
        with self._lock:
            return list(self._rules)

    def clear_faults(self) -> None:
        """Remove every partition, drop, delay and hook."""
        with self._lock:
            self._partitions.clear()
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.removed.set()

    # -- counters --------------------------------------------------------------------------------

    def stats(self) -> dict[str, ActionStats]:
        """A snapshot of the message counters, per action."""
        with self._lock:
            return {action: ActionStats(**vars(s)) for action, s in self._stats.items()}

    def count(self, action_glob: str = "*", what: str = "sent") -> int:
        """Sum of one counter (``sent``, ``delivered``, ``dropped_requests``...) over the actions matching a glob."""
        if what not in ActionStats.__dataclass_fields__:
            raise InvalidTransportRequest(f"no counter {what!r}; counters are {sorted(ActionStats.__dataclass_fields__)}")
        with self._lock:
            return sum(getattr(s, what) for a, s in self._stats.items() if fnmatch.fnmatchcase(a, action_glob))

    def reset_stats(self) -> None:
        """Zero the per-action message counters."""
        with self._lock:
            self._stats.clear()

    # -- sending ---------------------------------------------------------------------------------

    def _fired(self, kind: str, direction: str, sender: str, target: str, action: str) -> list[Rule]:
        """Matching rules of one kind/direction that fire for this message (lock held)."""
        return [
            r for r in list(self._rules)
            if r.kind == kind and r.direction == direction and r.matches(sender, target, action) and r._fire()
        ]

    def _unreachable(self, sender: str, target: str, token: object | None) -> str | None:
        """Why ``target`` cannot be reached from ``sender`` now (lock held); None when it can."""
        reg = self._nodes.get(target)
        if reg is None:
            return f"node {target!r} is not registered"
        if token is not None and reg.token is not token:
            return f"node {target!r} restarted while handling the request"
        if any(p.blocks(sender, target) for p in self._partitions):
            return f"{sender!r} and {target!r} are partitioned"
        return None

    def send(self, sender: str, target: str, action: str, request: Any, timeout: float | None = None) -> Any:
        """Deliver ``request`` to ``target``'s handler and return its response.

        Raises :class:`NodeDisconnected` when the request or its response is lost (see
        the module docstring for ``delivered``); an exception of the handler propagates
        unchanged.  ``timeout`` (default: the transport's ``default_timeout``) bounds the
        injected delays; a handler slower than it is noticed once it returns (its
        response is then treated as lost).
        """
        if timeout is None:
            timeout = self.default_timeout
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout

        with self._lock:
            st = self._stats.setdefault(action, ActionStats())
            st.sent += 1
            dropped = bool(self._fired("drop", "request", sender, target, action))
            if dropped:
                st.dropped_requests += 1
            delays = self._fired("delay", "request", sender, target, action) if not dropped else []
        if dropped:
            self._disconnected(action, NodeDisconnected(sender, target, action, "request dropped", delivered=False))

        if delays and not self._sleep(delays, deadline):
            self._timed_out(action, NodeDisconnected(
                sender, target, action, f"request timed out after {timeout}s", delivered=False))

        with self._lock:
            hooks = [r.hook for r in self._fired("hook", "request", sender, target, action)]
        for hook in hooks:
            assert hook is not None
            hook(sender, target, action, request)

        with self._lock:
            why = self._unreachable(sender, target, None)
            if why is None:
                reg = self._nodes[target]
                st.delivered += 1
        if why is not None:
            self._disconnected(action, NodeDisconnected(sender, target, action, why, delivered=False))

        error: BaseException | None = None
        response: Any = None
        try:
            response = reg.handler(action, request)
        except BaseException as exc:  # noqa: BLE001 - handed back below (or lost with the response)
            error = exc
            with self._lock:
                st.errors += 1

        with self._lock:
            dropped = bool(self._fired("drop", "response", sender, target, action))
            if dropped:
                st.dropped_responses += 1
            delays = self._fired("delay", "response", sender, target, action) if not dropped else []
        if dropped:
            self._disconnected(action, NodeDisconnected(sender, target, action, "response dropped", delivered=True), error)

        if delays and not self._sleep(delays, deadline):
            self._timed_out(action, NodeDisconnected(
                sender, target, action, f"response timed out after {timeout}s", delivered=True), error)
        if deadline is not None and time.monotonic() > deadline:
            self._timed_out(action, NodeDisconnected(
                sender, target, action, f"no response within {timeout}s", delivered=True), error)

        with self._lock:
            why = self._unreachable(sender, target, reg.token)
            if why is None:
                st.responded += 1
        if why is not None:
            self._disconnected(action, NodeDisconnected(
                sender, target, action, f"{why} before it responded", delivered=True), error)

        if error is not None:
            raise error
        return response

    def _sleep(self, delays: list[Rule], deadline: float | None) -> bool:
        """Wait out ``delays`` (one after the other) or until ``deadline``; a delay removed meanwhile ends at
        once (a link healed, a paused node resumed: the message goes on).  False when the deadline cut it short."""
        for rule in delays:
            until = time.monotonic() + rule.seconds
            if deadline is not None and deadline < until:
                rule.removed.wait(max(deadline - time.monotonic(), 0.0))
                if not rule.removed.is_set():
                    return False
            else:
                rule.removed.wait(max(until - time.monotonic(), 0.0))
        return True

    def _disconnected(self, action: str, exc: NodeDisconnected, cause: BaseException | None = None) -> None:
        with self._lock:
            self._stats.setdefault(action, ActionStats()).disconnected += 1
        raise exc from cause

    def _timed_out(self, action: str, exc: NodeDisconnected, cause: BaseException | None = None) -> None:
        with self._lock:
            self._stats.setdefault(action, ActionStats()).timed_out += 1
        self._disconnected(action, exc, cause)

    def __repr__(self) -> str:
        with self._lock:
            return (f"Transport(nodes={sorted(self._nodes)}, partitions={len(self._partitions)}, "
                    f"rules={len(self._rules)})")
