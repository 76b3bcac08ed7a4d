"""The conformance matrix's cells: (engine, paradigm, strategy, failure form).

The cells come from the engines' own declarations (:mod:`trainthrough.engines.registry`):
a cell an engine claims is run by ``tests/conformance`` with the same invariants on
every engine; a cell it does not claim must be refused before anything starts.
``trainthrough list --engines`` prints them, marking what the conformance tests run.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainthrough.engines import registry
from trainthrough.faults.spec import parse
from trainthrough.ft.strategy import PRESETS, resolve


@dataclass(frozen=True)
class Form:
    """A failure form: its specs (per clock) and how many failures it must inject."""

    name: str
    paradigm: str
    sim: tuple[str, ...]
    real: tuple[str, ...]
    count: int
    chains_only: bool = False  # names a chain position: only chains have one


FORMS = [
    Form("iter", "ps", ("shards=1@iter=35",), ("shards=1@iter=35",), 1),
    Form("time", "ps", ("shards=1@time=0.1s",), ("shards=1@time=1.5s",), 1),
    Form("mtbf", "ps", ("shard=any@mtbf=0.05s,max=2",), ("shard=any@mtbf=1s,max=2",), 2),
    Form("worker", "ps", ("worker=1@iter=35",), ("worker=1@iter=35",), 1),
    Form("during-recovery", "ps", ("shards=1@iter=35", "shards=2@iter=35,phase=recovery"),
         ("shards=1@iter=35", "shards=2@iter=35,phase=recovery"), 2),
    Form("replica", "ps", ("shards=0@iter=35,replica=1",), ("shards=0@iter=35,replica=1",),
         1, chains_only=True),
    Form("iter", "dp", ("rank=1@iter=12",), ("rank=1@iter=12",), 1),
    Form("forward", "dp", ("rank=1@iter=12,phase=forward",),
         ("rank=1@iter=12,phase=forward",), 1),
    Form("allreduce", "dp", ("rank=1@iter=12,phase=allreduce:0",),
         ("rank=1@iter=12,phase=allreduce:0",), 1),
    Form("update", "dp", ("rank=1@iter=12,phase=update",), ("rank=1@iter=12,phase=update",), 1),
    Form("during-recovery", "dp", ("rank=1@iter=12", "rank=2@iter=12,phase=recovery"),
         ("rank=1@iter=12", "rank=2@iter=12,phase=recovery"), 2),
    Form("hang", "dp", ("rank=1@iter=12,mode=hang",), ("rank=1@iter=12,mode=hang",), 1),
    # A notice (SIGTERM, then SIGKILL): the rank drains at a step boundary, one the
    # group agrees on (with a relaxed sync, an outer step's): early, so that the drain
    # comes before a run that reaches its target in a few tens of steps has stopped.
    Form("preempt", "dp", ("rank=1@iter=3,mode=preempt:10s",),
         ("rank=1@iter=3,mode=preempt:10s",), 1),
    # Relaxed sync (localsgd, diloco): lost among inner steps, or at an outer step.
    Form("inner", "dp", ("rank=1@iter=12,phase=inner",), ("rank=1@iter=12,phase=inner",), 1),
    Form("outer", "dp", ("rank=1@iter=12,phase=outer",), ("rank=1@iter=12,phase=outer",), 1),
    # Stopped past the collective timeout (2 s on the real engines, sim's default 10 s),
    # then continued: a loss like a hang's, and the woken rank fenced out.
    Form("pause", "dp", ("rank=1@iter=12,mode=pause:30s",), ("rank=1@iter=12,mode=pause:3s",),
         1),
    # Ranks cut off from the controller's side, alive, past the collective timeout:
    # fenced and recovered as lost, their report after the heal refused. Only sim
    # injects it from a spec (gloo's ranks share one host's network; the two-host tests
    # cut real namespaces apart): the real engines' cells are refusals.
    Form("partition", "dp", ("rank=1@iter=12,mode=partition:30s",),
         ("rank=1@iter=12,mode=partition:8s",), 1),
    # A straggler from iteration 12 on: nothing fails (no deadline here), the group runs
    # at its pace; tests/test_sim_kinds.py drops it with --straggler-deadline.
    Form("slow", "dp", ("rank=1@iter=12,mode=slow:4x",), ("rank=1@iter=12,mode=slow:4x",), 1),
]


@dataclass(frozen=True)
class Cell:
    engine: str
    paradigm: str
    strategy: str
    form: Form

    @property
    def id(self) -> str:
        return f"{self.engine}-{self.paradigm}-{self.strategy}-{self.form.name}"

    def specs(self) -> list[str]:
        return list(self.form.sim if self.engine == "sim" else self.form.real)


def claimed(c: Cell) -> bool:
    """Whether the engine claims this cell (the answer validation gives)."""
    if c.form.chains_only and resolve(c.strategy).replication == "none":
        return False
    return registry.claims(c.engine, c.paradigm, resolve(c.strategy),
                           parse(c.specs())) is not None


def all_cells() -> list[Cell]:
    return [Cell(e, f.paradigm, s, f) for e in registry.names() for s, p in PRESETS.items()
            for f in FORMS if f.paradigm in p.paradigms]


# Strategies whose invariants (3, 4 below) are checked on an ``iter`` failure.
_ON_ITER = {"checkpoint-restart", "scar-partial", "checkpoint-sync", "worker-copy"}


def covering(cells: list[Cell]) -> list[Cell]:
    """Claimed cells to run: all of them on sim (milliseconds each); on real engines
    (seconds each: actors and processes start) every claimed strategy once and every
    claimed failure form at least once, forms dealt out across the strategies."""
    out = [c for c in cells if c.engine == "sim" and claimed(c)]
    for engine in ("ray", "gloo"):
        for paradigm in ("ps", "dp"):
            mine = [c for c in cells if (c.engine, c.paradigm) == (engine, paradigm)
                    and claimed(c)]
            forms = list(dict.fromkeys(c.form.name for c in mine))
            strategies = list(dict.fromkeys(c.strategy for c in mine))
            todo = [f for f in forms if f != "iter"]
            for s in strategies:
                options = {c.form.name: c for c in mine if c.strategy == s}
                pick = "iter" if s in _ON_ITER else next(
                    (f for f in todo if f in options), "iter")
                if pick in todo:
                    todo.remove(pick)
                out.append(options[pick])
            for f in todo:  # forms no strategy took yet
                out.append(next(c for c in mine if c.form.name == f))
    return out


def matrix_lines() -> list[str]:
    """The capability matrix as text: per strategy and per failure form, what each
    engine claims (``-``: refused before the run), ``*`` where tests/conformance runs it."""
    engines = registry.names()
    cells = all_cells()
    tested = covering(cells)
    ran_s = {(c.engine, c.paradigm, c.strategy) for c in tested}
    ran_f = {(c.engine, c.paradigm, c.form.name) for c in tested}
    width = 14
    lines = ["what each engine claims: its consistency modes per strategy, 'yes' per failure",
             "form; '-' is refused before the run starts; '*': run by tests/conformance",
             "(sim and gloo in bsp, Ray ps in async, Ray dp in bsp; Ray ps bsp against sim in tests/test_ray_bsp.py)",
             f"  {'strategy / failure form':<34}{'paradigm':<10}"
             + "".join(f"{n:<{width}}" for n in engines)]
    for name, strategy in PRESETS.items():
        for paradigm in strategy.paradigms:
            row = []
            for n in engines:
                modes = registry.claims(n, paradigm, strategy)
                mark = "*" if (n, paradigm, name) in ran_s else ""
                row.append(f"{(modes or '-') + mark:<{width}}")
            lines.append(f"  {name:<34}{paradigm:<10}" + "".join(row))
    for form in FORMS:
        row = []
        for n in engines:
            mine = [c for c in cells if c.engine == n and c.form is form]
            ok = any(claimed(c) for c in mine)
            mark = "*" if (n, form.paradigm, form.name) in ran_f else ""
            row.append(f"{('yes' if ok else '-') + mark:<{width}}")
        shown = " + ".join(form.sim)
        lines.append(f"  {shown[:33]:<34}{form.paradigm:<10}" + "".join(row))
    return lines
