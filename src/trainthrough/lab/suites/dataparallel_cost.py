"""The data-parallel suite's cost model, in a module of its own: the suite sets it on
every run and the report's performance model reads the same figures back."""

from __future__ import annotations

from trainthrough.config import CostModel

# Costs of the same order as benchmarks/dp_recovery.py reads on local gloo processes
# (docs/benchmarks.md): a crash is seen in tens of milliseconds, survivors re-form in a
# fraction of a second, restarting every rank process takes seconds. compute_scale
# makes a simulated step about as long as a real one.
COST = CostModel(compute_scale=10.0, detection_seconds=0.03, reform_seconds=0.3,
                 restart_seconds=3.0, replace_seconds=1.0)
