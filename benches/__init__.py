"""shardstore benchmarks: ``python -m benches [names...] [--quick] [--json-only] [--out FILE]``.

Each bench is a module of this package exposing ``run(ctx) -> Iterator[Figure]``; the
registry is :data:`benches.runner.BENCHES`.  See ``benches/README.md``.
"""

from benches.runner import BENCHES, Context, Figure

__all__ = ["BENCHES", "Context", "Figure"]
