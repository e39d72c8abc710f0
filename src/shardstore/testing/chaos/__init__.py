"""A deterministic, seeded fault simulator for the engine (issue 14), in the spirit of FoundationDB's
simulation testing and Jepsen's checkers.

- :mod:`.schedule`: a schedule of steps drawn from a seed (pure);
- :mod:`.model`: the client model and its checks (pure);
- :mod:`.runner`: runs a schedule against a real in-process cluster over a fault-injecting
  store, checks it, and minimises failing schedules.

``python -m benches chaos --seeds N`` runs N schedules and prints the totals;
``tests/engine/test_chaos.py`` runs a few fixed seeds.
"""

from shardstore.testing.chaos.model import ClientModel, Violation
from shardstore.testing.chaos.runner import Outcome, minimise, run_schedule, run_seed
from shardstore.testing.chaos.schedule import Step, draw_schedule

__all__ = ["ClientModel", "Outcome", "Step", "Violation", "draw_schedule", "minimise", "run_schedule", "run_seed"]
