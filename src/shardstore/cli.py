"""The shardstore command: run a node, look at a running cluster, check a store, read the cluster state.

Read-only commands (cluster-state show) open the store read-only: they create
nothing and fail on a missing root.  store check writes scratch blobs but does not
create a missing root unless asked (-o create=true).  Every error is one line on
stderr (shardstore: error: ...): exit status 2 for a usage error (a missing or bad
argument), 1 for any other.  A closed pipe (| head) ends the command quietly with exit
status 141 (128 + SIGPIPE, what a shell reports for other tools).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from shardstore import __version__
from shardstore.errors import InvalidError, ShardstoreError

if TYPE_CHECKING:
    from shardstore.blobstores.base import BlobStore

#: Exit status after the reader of stdout went away (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141
#: Exit status of a usage error (a missing or malformed argument), as argparse and most Unix tools.
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse's parser with one-line usage errors (``shardstore: error: ...``, exit 2) naming the help to read."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """Print the usage error as one line and exit with :data:`EXIT_USAGE`."""
        where = self.prog.removeprefix("shardstore").strip()
        self.exit(EXIT_USAGE, f"shardstore: error: {where + ': ' if where else ''}{message} (see {self.prog} --help)\n")


class UsageError(InvalidError):
    """A command-line argument the parser accepted but the command cannot use."""


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"-o expects name=value, got {pair!r}")
        out[name] = value
    return out


def _open_store(
    url: str, options: dict[str, Any], *, read_only: bool = False, create_root: bool = True
) -> BlobStore:
    """Open ``url``: read-only, or without creating a missing root unless the options ask for it; a refused
    connection fails at once (nothing listens there) unless ``-o retry_unreachable=true``."""
    from shardstore.blobstores import open_store, plugin_class
    from shardstore.blobstores.options import parse_url

    options = {"retry_unreachable": False, **options}

    if read_only:
        return open_store(url, **{**options, "read_only": True})
    parsed = parse_url(url)
    if not create_root and "create" in getattr(plugin_class(parsed.scheme), "OPTIONS", {}):
        options = {"create": False, **options}
    return open_store(url, **options)


def _cmd_plugins(args: argparse.Namespace) -> int:
    from shardstore.blobstores import plugins

    found = plugins()
    rows = [(p.scheme, p.target, p.package, p.version) for p in found]
    if not rows:
        print("no blob-store plugins installed")
        return 1
    widths = [max(len(r[i]) for r in rows + [("scheme", "class", "package", "version")]) for i in range(4)]
    for row in [("scheme", "class", "package", "version"), *rows]:
        print("  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip())
    conflicts = [p for p in found if p.conflicts]
    for p in conflicts:
        print(f"conflict: scheme {p.scheme!r} is also claimed by {', '.join(p.conflicts)}", file=sys.stderr)
    return 1 if conflicts else 0


def _cmd_store_check(args: argparse.Namespace) -> int:
    from shardstore.blobstores.selfcheck import CheckResult, run_checks

    store = _open_store(args.url, _parse_options(args.option), create_root=False)
    print(f"checking {store.location} (scratch prefix {args.prefix}/...)", flush=True)

    def show(r: CheckResult) -> None:
        status = "PASS" if r.ok else "FAIL"
        print(f"  {status}  {r.name:<18}  {r.millis:8.1f} ms  {r.detail}".rstrip(), flush=True)

    try:
        results = run_checks(store, scratch=args.prefix, on_result=show)
    finally:
        store.close()
    passed = sum(r.ok for r in results)
    m = store.metrics()
    reqs = ", ".join(f"{k} {v}" for k, v in m["requests"].items())
    print(f"{passed}/{len(results)} checks passed; requests: {reqs}; retries {m['retries']}, throttles {m['throttles']}")
    return 0 if passed == len(results) else 1


def _cmd_cluster_state_show(args: argparse.Namespace) -> int:
    from shardstore.blobstores import ConfigError
    from shardstore.cluster_state.report import format_inspection, inspect_store

    store = _open_store(args.url, _parse_options(args.option), read_only=True)
    try:
        report = inspect_store(store, keep=args.keep, verify=not args.no_verify)
        if not report.uuids:
            raise ConfigError(f"no shardstore cluster state here: {_what_is_there(store)}; it is not a "
                              f"shardstore store, or no cluster has published to it yet", location=store.location)
    finally:
        store.close()
    print(format_inspection(report), flush=True)
    return 0 if report.ok else 1


def _what_is_there(store: BlobStore) -> str:
    """What a store without cluster state holds, in a few words (nothing, or its first keys)."""
    found = []
    for info in store.list(""):
        found.append(info.key)
        if len(found) > 3:
            break
    if not found:
        return "it holds no blob at all"
    shown = ", ".join(repr(k) for k in found[:3])
    return f"it holds other blobs ({shown}{', ...' if len(found) > 3 else ''})"


def _at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


#: node settings: flag -> (settings-file key, environment variable)
_NODE_KEYS = ("name", "data_dir", "store", "listen", "publish", "peer_addresses", "seed_hosts", "initial_managers", "roles", "tls_cert", "tls_key",
              "tls_ca", "mutual_tls", "fd_interval", "fd_timeout", "fd_retries", "request_timeout", "log_level",
              "translog_gc_grace", "translog_gc_every")


def _node_settings(args: argparse.Namespace) -> Any:
    """A node's settings: flags first, then the settings file (JSON), then ``SHARDSTORE_NODE_<KEY>``, then defaults."""
    import json

    from shardstore.engine.manager.translog_gc import COLLECT_EVERY, GRACE_SECONDS
    from shardstore.engine.node.fault_detection import FaultDetectionSettings
    from shardstore.engine.node.process import ROLES, NodeSettings
    from shardstore.net.security import Security

    from_file: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config) as f:
                from_file = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"node settings file {args.config}: {exc}") from None
        unknown = set(from_file) - set(_NODE_KEYS) - {"store_options", "secret"}
        if unknown:
            raise UsageError(f"node settings file {args.config}: unknown keys {sorted(unknown)}")

    def get(key: str, default: Any = None) -> Any:
        value = getattr(args, key, None)
        if value is None:
            value = from_file.get(key)
        if value is None:
            value = os.environ.get(f"SHARDSTORE_NODE_{key.upper()}")
        return default if value is None else value

    def names(value: Any) -> tuple[str, ...]:
        return tuple(v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip())

    for flag in ("listen", "publish"):
        value = get(flag)
        if value is not None:
            _check_address(f"--{flag}", str(value))
    missing = [r for r in ("name", "data_dir", "store") if not get(r)]
    if missing:
        flags = " and ".join(f"--{r.replace('_', '-')}" for r in missing)
        raise UsageError(f"a node needs {flags} (or {', '.join(repr(r) for r in missing)} in the settings file, or "
                         f"{', '.join(f'SHARDSTORE_NODE_{r.upper()}' for r in missing)}; see shardstore node --help)")
    secret = from_file.get("secret") or os.environ.get("SHARDSTORE_NODE_SECRET")  # never a flag: ps shows flags
    security = Security(tls_cert=get("tls_cert"), tls_key=get("tls_key"), tls_ca=get("tls_ca"), secret=secret,
                        mutual_tls=str(get("mutual_tls", "false")).lower() in ("1", "true", "yes"))
    try:
        fd = FaultDetectionSettings(float(get("fd_interval", 0.5)), float(get("fd_timeout", 1.0)),
                                    int(get("fd_retries", 3)))
        request_timeout = float(get("request_timeout", 30.0))
        if not request_timeout > 0:
            raise ValueError(f"--request-timeout must be a positive number of seconds, not {request_timeout}")
        gc = {k: float(get(k, d)) for k, d in (("translog_gc_grace", GRACE_SECONDS), ("translog_gc_every", COLLECT_EVERY))}
        if gc["translog_gc_grace"] < 0 or not gc["translog_gc_every"] > 0:
            raise ValueError(f"translog_gc_grace must be >= 0 and translog_gc_every > 0 seconds, got {gc}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    peers: dict[str, str] = {}
    for item in names(get("peer_addresses", "")):
        peer, sep, address = item.partition("=")
        if not sep or not peer.strip() or not address.strip():
            raise UsageError(f"--peer-addresses takes NAME=HOST:PORT,..., got {item!r}")
        peers[peer.strip()] = address.strip()
    return NodeSettings(
        request_timeout=request_timeout, peer_addresses=peers,
        name=get("name"), data_dir=get("data_dir"), store=get("store"), listen=get("listen", "127.0.0.1:9400"),
        publish=get("publish"),
        seed_hosts=names(get("seed_hosts", "")), initial_managers=names(get("initial_managers", "")),
        roles=frozenset(names(get("roles", ",".join(sorted(ROLES))))), fault_detection=fd, security=security, **gc,
        store_options=_no_new_root(get("store"), {**from_file.get("store_options", {}), **_parse_options(args.option)}))


def _no_new_root(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """A node's store options: like every command, it creates a missing store root only when asked (``create=true``)."""
    from shardstore.blobstores import plugin_class
    from shardstore.blobstores.options import parse_url
    from shardstore.errors import ShardstoreError

    try:
        parsed = parse_url(url)
        has_create = "create" in getattr(plugin_class(parsed.scheme), "OPTIONS", {})
    except ShardstoreError:
        return options  # the node's own open names what is wrong with the URL
    if has_create and "create" not in options and "create" not in parsed.query:
        return {"create": False, **options}
    return options


def _check_address(flag: str, value: str) -> None:
    """A ``host:port`` flag, as the transport parses it (``split_address``): UsageError naming the flag."""
    from shardstore.net.flight import split_address
    from shardstore.transport import InvalidTransportRequest

    try:
        split_address(value)
    except InvalidTransportRequest:
        raise UsageError(f"{flag} takes HOST:PORT with a port from 0 to 65535, got {value!r}") from None


def _cmd_cluster(args: argparse.Namespace) -> int:
    from shardstore.engine.client import connect
    from shardstore.engine.coordinator.cluster_view import format_health, format_nodes, format_shards, to_json
    from shardstore.net.security import Security

    hosts = args.hosts or os.environ.get("SHARDSTORE_HOSTS")
    if not hosts:
        raise UsageError("cluster commands need --hosts HOST:PORT,... (or SHARDSTORE_HOSTS)")
    for host in hosts.split(","):
        if host.strip():
            _check_address("--hosts", host.strip())
    secret = os.environ.get("SHARDSTORE_NODE_SECRET")  # never a flag: ps shows flags
    security = Security(tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, secret=secret) \
        if (args.tls_ca or secret) else None
    client = connect(hosts, security=security, timeout=args.timeout)
    try:
        view = client.cluster()
    finally:
        client.close()
    what = args.cluster_command
    if args.format == "json":
        print(to_json(view, what))
    else:
        print({"health": format_health, "nodes": format_nodes, "shards": format_shards}[what](view))
    health = view["health"]
    return 0 if what != "health" or health.get("status") in ("green", "yellow") else 1


def _cmd_node(args: argparse.Namespace) -> int:
    import logging

    from shardstore.engine.node.process import run_node

    settings = _node_settings(args)
    level = str(args.log_level or os.environ.get("SHARDSTORE_NODE_LOG_LEVEL", "WARNING")).upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {settings.name} %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().getEffectiveLevel() == logging.WARNING:
        # at the default level: the cluster forming, its manager, nodes joining and leaving (engine/manager/role.py)
        logging.getLogger("shardstore.events").setLevel(logging.INFO)
    return run_node(settings)


def _command_group(sub: Any, name: str, help_text: str) -> Any:
    """A command that only groups subcommands; run alone, it prints its own help (a usage error)."""
    group = sub.add_parser(name, help=help_text)
    group.set_defaults(func=None, parser=group)
    return group.add_subparsers(dest=f"{name.replace('-', '_')}_command", metavar="COMMAND")


def _store_options(parser: argparse.ArgumentParser) -> None:
    """The repeatable ``-o NAME=VALUE`` store option of every command that opens a store."""
    parser.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                        help="store option (repeatable), e.g. -o endpoint_url=http://127.0.0.1:9000")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``shardstore`` command."""
    parser = _Parser(prog="shardstore", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shardstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("plugins", help="list the installed blob-store plugins")
    p.set_defaults(func=_cmd_plugins, leaf=p)

    store_sub = _command_group(sub, "store", "blob-store tools")
    check = store_sub.add_parser(
        "check", help="self-test a store: put, get, range, list, conditional create, delete, clean-up"
    )
    check.add_argument("url", help="store URL, e.g. s3://bucket/prefix or file:///tmp/store")
    _store_options(check)
    check.add_argument("--prefix", default="_shardstore_check", help="scratch prefix (removed afterwards)")
    check.set_defaults(func=_cmd_store_check, leaf=check)

    cs_sub = _command_group(sub, "cluster-state", "remote cluster-state tools")
    show = cs_sub.add_parser(
        "show", help="the UUID chain, the latest committed manifest, and problems (orphans, missing or corrupt blobs)"
    )
    show.add_argument("url", help="store URL of the cluster, e.g. s3://bucket/prefix or file:///tmp/store")
    _store_options(show)
    show.add_argument("--keep", type=_at_least_one, default=10, help="manifests a purge keeps per UUID (default 10)")
    show.add_argument("--no-verify", action="store_true", help="do not read back the latest state's entities")
    show.set_defaults(func=_cmd_cluster_state_show, leaf=show)

    cl_sub = _command_group(sub, "cluster", "look at a running cluster (health, nodes, shards)")
    for name, text in (("health", "status, nodes, shard counts, the manager and its term (exit 1 when red)"),
                       ("nodes", "each node: address, manager, copies, primaries, documents, size"),
                       ("shards", "each shard copy: primary or replica, state, node, documents, size, translog "
                                  "backlog")):
        view = cl_sub.add_parser(name, help=text)
        view.add_argument("--hosts", help="HOST:PORT,... of one or more nodes (or SHARDSTORE_HOSTS)")
        view.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
        view.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the answer (20)")
        view.add_argument("--tls-ca", dest="tls_ca", help="PEM CA of the nodes' certificates (TLS)")
        view.add_argument("--tls-cert", dest="tls_cert", help="PEM client certificate (mutual TLS)")
        view.add_argument("--tls-key", dest="tls_key", help="PEM client key (mutual TLS)")
        view.set_defaults(func=_cmd_cluster, leaf=view)

    node = sub.add_parser("node", help="run a node process (data and cluster-manager roles) until SIGTERM")
    node.add_argument("--name", help="this node's name, unique in the cluster")
    node.add_argument("--data-dir", dest="data_dir", help="this node's local directory (shard copies, votes)")
    node.add_argument("--store", help="the cluster's blob store URL, e.g. file:///srv/store or s3://bucket/prefix")
    node.add_argument("--listen", help="host:port to listen on (default 127.0.0.1:9400; any other host needs TLS "
                                       "and a cluster secret or mutual TLS)")
    node.add_argument("--publish", help="host:port other nodes reach this one at (default: the listen address)")
    node.add_argument("--peer-addresses", dest="peer_addresses",
                      help="NAME=HOST:PORT,...: reach these peers there, not at the address they publish (a proxy)")
    node.add_argument("--seed-hosts", dest="seed_hosts", help="host:port,host:port of other nodes to discover")
    node.add_argument("--initial-managers", dest="initial_managers",
                      help="names of the cluster-manager-eligible nodes that bootstrap a new cluster")
    node.add_argument("--roles", help="data,cluster_manager (default both)")
    node.add_argument("--tls-cert", dest="tls_cert", help="PEM certificate of this node")
    node.add_argument("--tls-key", dest="tls_key", help="PEM key of this node")
    node.add_argument("--tls-ca", dest="tls_ca", help="PEM CA that signs the other nodes' certificates")
    node.add_argument("--mutual-tls", dest="mutual_tls", default=None, help="true: require client certificates")
    node.add_argument("--fd-interval", dest="fd_interval", help="seconds between fault-detection checks (0.5)")
    node.add_argument("--fd-timeout", dest="fd_timeout", help="seconds a check may take (1.0)")
    node.add_argument("--fd-retries", dest="fd_retries", help="failed checks before a node is removed (3)")
    node.add_argument("--request-timeout", dest="request_timeout",
                      help="seconds a node-to-node request without a timeout of its own waits for its answer (30)")
    node.add_argument("--config", help="a JSON settings file (same keys as the flags, plus 'secret' and "
                                       "'store_options'); the cluster secret comes from there or SHARDSTORE_NODE_SECRET")
    node.add_argument("--log-level", dest="log_level", help="WARNING (default), INFO, DEBUG")
    _store_options(node)
    node.set_defaults(func=_cmd_node, leaf=node)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardstore`` command line; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # a typo in a subcommand's option: that subcommand's help, not the top level's
        (getattr(args, "leaf", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    func = getattr(args, "func", None)
    if func is None:  # a command that needs a subcommand (or none at all): its own help, a usage error
        (getattr(args, "parser", None) or parser).print_help(sys.stderr)
        return EXIT_USAGE
    quiet = _quiet_sdks() if func is not _cmd_node else contextlib.nullcontext()
    try:
        with quiet:
            status = int(func(args))
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as exc:
        print(f"shardstore: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (ShardstoreError, OSError) as exc:
        print(f"shardstore: error: {_one_line(exc)}", file=sys.stderr)
        return 1


#: loggers of the SDKs under the stores: azure-identity alone logs a page per credential it could not find
_SDK_LOGGERS = ("azure", "adlfs", "botocore", "boto3", "aiobotocore", "s3fs", "gcsfs", "google", "urllib3", "fsspec")


@contextlib.contextmanager
def _quiet_sdks() -> Iterator[None]:
    """Keep the SDKs' log records off stderr while a command runs (its one error line says what failed); their
    levels are restored after it (``main`` may run inside another program, a test suite among them)."""
    import logging

    loggers = [logging.getLogger(name) for name in _SDK_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` and its notes on one line."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, ShardstoreError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename is not None else exc.strerror
    parts = [text, *getattr(exc, "__notes__", [])]
    return "; ".join(" ".join(line.strip() for line in part.splitlines() if line.strip()) for part in parts)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the flush at exit cannot raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (stdout replaced in-process)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
