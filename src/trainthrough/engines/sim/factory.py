"""Build the ``sim`` engine for a run: the parameter-server or the data-parallel host."""

from __future__ import annotations

from trainthrough.engines.base import Engine, RunContext


def build(ctx: RunContext) -> Engine:
    if ctx.cfg.paradigm == "dp":
        from trainthrough.engines.sim.dp_engine import SimDPEngine

        return SimDPEngine(ctx)
    from trainthrough.engines.sim.engine import SimEngine

    return SimEngine(ctx)
