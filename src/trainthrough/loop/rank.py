"""A rank process running a user's loop: import it by reference, hand it a :class:`Loop`.

Started like any rank of the controller (``rank_main`` with ``spec["loop"]`` set: a
local process, or a Ray actor), which calls :func:`run_loop` by the name the marker
carries (:data:`trainthrough.loop.api.RANK_ENTRY`): the engines never import this layer. The user's function builds its model and calls
``loop.attach``, which builds the replica (:class:`~trainthrough.dp.module_replica.ModuleReplica`),
the :class:`~trainthrough.engines.gloo.trainer.Trainer` and the
:class:`~trainthrough.engines.gloo.session.RankSession` of every rank process, and
joins the run. The first rank's return value is posted to the controller.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.dp.devices import cuda_count, resolve_device
from trainthrough.dp.hooks import Hooks
from trainthrough.dp.module_replica import Fetch, ModuleReplica
from trainthrough.dp.rank import micro_seed
from trainthrough.engines.gloo.messages import Returned
from trainthrough.engines.gloo.protocol import MAX_VALUE_BYTES, RankSpec, post
from trainthrough.engines.gloo.session import RankSession
from trainthrough.engines.gloo.trainer import Trainer
from trainthrough.errors import Retired, UserError
from trainthrough.loop.api import Loop
from trainthrough.workloads import reference
from trainthrough.workloads.base import Evaluation
from trainthrough.workloads.user_loop import TrainingLoop


def run_loop(spec: RankSpec, store: dist.TCPStore) -> None:
    """Run the user's ``train(loop)`` as rank ``spec.slot`` to its end."""
    cfg = RunConfig.from_dict(spec.run.config)
    assert spec.run.loop is not None  # rank_main runs this only for a user's loop
    marked = reference.load(spec.run.loop)
    if not isinstance(marked, TrainingLoop):
        raise UserError(f"{spec.run.loop} is not marked with @training_loop")
    slot = spec.slot
    # torchrun's LOCAL_RANK convention: the rank's slot picks its GPU (modulo the GPUs).
    device = resolve_device(cfg.device, slot, cuda_count())

    def attach(model: torch.nn.Module, opt: torch.optim.Optimizer, fetch: Fetch,
               samples: int, batch_size: int, evaluate: Callable[[], float] | None,
               state: Mapping[str, Any] | None,
               hooks: Hooks) -> tuple[RankSession, ModuleReplica]:
        hooks.every = cfg.eval_every or marked.eval_every
        replica = ModuleReplica(slot, model, opt, fetch, cfg.seed, state, hooks)
        if cfg.device != "auto" and not _same(cfg.device, replica.device, device):
            raise UserError(f"--device {cfg.device}, but rank {slot}'s model is on "
                            f"{replica.device}: build it with .to(loop.device)")
        tr = Trainer(cfg, slot, store, spec.orders, spec.run.t0, spec.run.checkpoint_url,
                     replica, samples, batch_size,
                     cfg.checkpoint_every or marked.checkpoint_every,
                     joining=spec.mode == "join")
        tr.evaluate_here = _metrics(marked, replica, evaluate)
        tr.before_step = lambda epoch, committed: hooks.before(
            epoch, committed, micro_seed(cfg.seed, committed, -2))
        return RankSession(spec, store, tr), replica

    loop = Loop(attach, slot, device)
    try:
        value = marked(loop, **cfg.workload_options)  # checked before the run started
    except Retired:
        value = None
    if loop._session is None:
        raise UserError(f"{spec.run.loop} returned without calling loop.attach(...)")
    session = loop._session
    if not session.over and session.g is not None:
        session.close(final=True)  # the loop ended on its own before its epochs were done
    retired = session.retired
    session.end()
    if not retired and value is not None:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            raise UserError("train(loop) must return a JSON value (numbers, strings, "
                            f"lists, dicts), not {type(value).__name__}") from None
        if len(text) > MAX_VALUE_BYTES // 2:  # it travels through the store, in a message
            raise UserError(f"train(loop) returned {len(text)} bytes of JSON: return at most "
                            f"{MAX_VALUE_BYTES // 2} (a summary), and write more to a file")
        post(store, Returned(slot=slot, value=json.loads(text)))


def _same(asked: str, actual: torch.device, resolved: torch.device) -> bool:
    """Whether a model on ``actual`` is where ``--device asked`` put it (``cuda``: any GPU)."""
    return actual.type == "cuda" if asked == "cuda" else actual == resolved


def _metrics(marked: TrainingLoop, replica: ModuleReplica,
             evaluate: Callable[[], float] | None) -> Callable[[], Evaluation]:
    """What the first rank reports at an evaluation: the user's metric, or the mean
    of its latest micro-batch losses."""
    def metrics() -> Evaluation:
        recent = replica.losses[-8:]
        loss = sum(recent) / len(recent) if recent else math.nan
        metric = float(evaluate()) if evaluate is not None else loss
        return Evaluation(metric, loss)

    return metrics
