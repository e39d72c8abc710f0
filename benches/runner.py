"""The bench runner: a registry of bench modules, one JSON line per figure, then a table.

A bench module exposes ``run(ctx: Context) -> Iterator[Figure]`` and may expose
``add_arguments(parser)`` to take options of its own (e.g. ``--backends``).  Figures go
to stdout as JSON lines the moment they are measured; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TextIO

#: name -> module (imported lazily, in this order).  Add a bench here.
BENCHES: dict[str, str] = {
    "blobstore": "benches.blobstore",
    "translog": "benches.translog",
    "segments": "benches.segments",
    "engine": "benches.engine",
    "cluster_state": "benches.cluster_state",
    "spark": "benches.spark",
    "ingest": "benches.ingest",
    "chaos": "benches.chaos",
    "failover": "benches.failover",
    "peers": "benches.peers",
    "cluster": "benches.cluster",
    "cost": "benches.cost",
    "partitions": "benches.partitions",
}


#: How long each bench takes on the 2-core machine (with its defaults; with ``--quick``), from the runner's own
#: ``[NAME] done in T s`` lines; ``--help`` and ``--list`` show them.  Re-measure after a bench changes size.
DURATIONS: dict[str, tuple[str, str]] = {
    "blobstore": ("2 min", "20 s"),
    "translog": ("35 s", "3 s"),
    "segments": ("3-4 min", "6-15 s"),
    "engine": ("1.5 min", "6-9 s"),
    "cluster_state": ("5 s", "1 s"),
    "spark": ("4.5 min", "45 s"),
    "ingest": ("1 min", "15 s"),
    "chaos": ("45 s", "1 min"),
    "failover": ("20 s", "5 s"),
    "peers": ("5-7 min", "45 s"),
    "cluster": ("25 s", "10 s"),
    "cost": ("45 s; +1 min s3", "35 s"),
    "partitions": ("5 min", "1.5 min"),
}


def durations_text() -> str:
    """The benches and how long each takes, one line each (the ``--help`` epilog and ``--list``)."""
    width = max(len(n) for n in BENCHES)
    lines = [f"{'bench':<{width}}  {'full run':<16}  --quick"]
    for name in BENCHES:
        full, quick = DURATIONS.get(name, ("?", "?"))
        lines.append(f"{name:<{width}}  {full:<16}  {quick}")
    return "\n".join(lines)


@dataclass
class Figure:
    """One measured figure.  ``target``/``met`` are optional (ratios with a goal)."""

    bench: str
    name: str
    value: float
    unit: str
    params: dict[str, Any] = field(default_factory=dict)
    target: str | None = None  # e.g. ">= 0.9"
    met: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The figure as one JSON object; ``target``/``met`` only when it has a target."""
        out: dict[str, Any] = {
            "bench": self.bench,
            "name": self.name,
            "value": round(self.value, 4) if isinstance(self.value, float) else self.value,
            "unit": self.unit,
            "params": self.params,
        }
        if self.target is not None:
            out["target"] = self.target
            out["met"] = self.met
        return out


@dataclass
class Context:
    """What a bench gets: the mode, its parsed options, and a progress printer."""

    bench: str
    quick: bool
    args: argparse.Namespace
    stderr: TextIO = sys.stderr
    #: summaries the bench wrote (a side-by-side table, a one-line verdict): on stdout after the figure table
    summaries: list[str] = field(default_factory=list)

    def progress(self, msg: str) -> None:
        """A progress line on stderr: ``[bench] msg``."""
        print(f"[{self.bench}] {msg}", file=self.stderr, flush=True)

    def summary(self, text: str) -> None:
        """A summary for the reader: on stderr now, and on stdout after the figure table (unless ``--json-only``)."""
        self.progress(text)
        self.summaries.append(text)

    def figure(self, name: str, value: float, unit: str, target: str | None = None,
               met: bool | None = None, **params: Any) -> Figure:
        """Build a Figure of this bench."""
        return Figure(self.bench, name, float(value), unit, params, target, met)


def _load(name: str) -> ModuleType:
    return importlib.import_module(BENCHES[name])


#: The table's width: a figure's params go on lines of their own below it, wrapped to fit.
TABLE_WIDTH = 120


def _table(figures: list[Figure], quick: bool = False) -> str:
    """An aligned, human-readable table of the figures, at most :data:`TABLE_WIDTH` columns wide.

    A ``--quick`` run measures sizes too small to judge a target by: its targets read
    ``indicative (quick)``, never ``met`` or ``NOT MET``.
    """
    rows = [("bench", "name", "value", "unit", "target")]
    params: list[str] = [""]
    for f in figures:
        value = f"{f.value:,.3f}" if abs(f.value) < 100 else f"{f.value:,.1f}"
        verdict = "indicative (quick)" if quick else ("met" if f.met else "NOT MET")
        target = "" if f.target is None else f"{f.target} {verdict}"
        rows.append((f.bench, f.name[:48], value, f.unit, target))
        params.append(" ".join(f"{k}={v}" for k, v in f.params.items()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {2}
    lines = []
    for n, r in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip()[:TABLE_WIDTH])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths)[:TABLE_WIDTH])
        elif params[n]:
            lines.extend(textwrap.wrap(params[n], TABLE_WIDTH, initial_indent="    ", subsequent_indent="      ",
                                       break_on_hyphens=False))
    if any(f.unit == "ratio" for f in figures):
        lines.insert(0, "every ratio reads higher-is-better for shardstore (1.0: even)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the named benches (default all); exit status 1 if any bench failed, else 0."""
    parser = argparse.ArgumentParser(prog="python -m benches", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="How long each takes on 2 cores:\n" + durations_text())
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benches to run (default all: {', '.join(BENCHES)})")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (CI smoke)")
    parser.add_argument("--json-only", action="store_true", help="no table at the end")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON lines to FILE")
    parser.add_argument("--list", action="store_true", help="list the registered benches and exit")
    # Bench-specific options: every registered bench may add its own.
    modules: dict[str, ModuleType] = {}
    for name in BENCHES:
        try:
            modules[name] = _load(name)
        except Exception as exc:  # a bench with a missing dependency must not break the others
            print(f"[runner] cannot import bench {name!r}: {exc}", file=sys.stderr)
            continue
        hook = getattr(modules[name], "add_arguments", None)
        if hook is not None:
            hook(parser.add_argument_group(f"{name} options"))
    args = parser.parse_args(argv)
    if args.list:
        print(durations_text())
        return 0
    names = args.names or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(unknown)} (known: {', '.join(BENCHES)})")

    out = open(args.out, "w", encoding="utf-8") if args.out else None
    figures: list[Figure] = []
    failed: list[str] = []
    contexts: list[Context] = []
    t0 = time.monotonic()
    try:
        for name in names:
            if name not in modules:
                failed.append(name)
                continue
            ctx = Context(bench=name, quick=args.quick, args=args)
            contexts.append(ctx)
            start = time.monotonic()
            try:
                for fig in modules[name].run(ctx):
                    line = json.dumps(fig.to_json(), sort_keys=False)
                    print(line, flush=True)
                    if out:
                        out.write(line + "\n")
                        out.flush()
                    figures.append(fig)
            except Exception:
                failed.append(name)
                print(f"[runner] bench {name!r} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            ctx.progress(f"done in {time.monotonic() - start:.1f}s")
    finally:
        if out:
            out.close()
    if not args.json_only:
        # A blank line separates the JSON lines from the table.
        print()
        print(_table(figures, quick=args.quick))
        for ctx in contexts:
            for text in ctx.summaries:
                print(f"\n[{ctx.bench}] {text}")
    print(f"[runner] {len(figures)} figures in {time.monotonic() - t0:.1f}s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def run_cleanups(cleanups: list[Callable[[], None]], what: str) -> None:
    """Run cleanups in reverse order; a failing one is reported on stderr, never raised (figures stay)."""
    for fn in reversed(cleanups):
        try:
            fn()
        except Exception as exc:  # cleanup must not hide the figures
            print(f"{what} failed: {exc}", flush=True, file=sys.stderr)
