"""Shard actors for tests that build a chain by hand, from the driver's actor pool.

Each shard actor is a Python process importing torch (~2.5 CPU seconds): a test that
starts three per chain, for every position and mode, spent more on starting processes
than on what it checks. Here a test takes pooled actors reset as a run's are
(``engines/ray/driver/pool.py``: ``reset`` runs the constructor's code, and
tests/test_ray_pool.py checks a run on reset actors equals one on fresh ones bit for
bit) and gives back the ones that end clean; a killed one is never reused.
"""

from __future__ import annotations

import uuid
from typing import Any

import ray
import torch

from trainthrough.engines.ray.actors.shard_actor import ShardActor
from trainthrough.engines.ray.driver.pool import POOL
from trainthrough.ps.layout import make_layout
from trainthrough.workloads.base import OptimizerSpec

KEY = ("shard",)  # the driver's own key: runs and these tests share the idle actors


class Shards(list[Any]):
    """The handles, in chain order; :meth:`give_back` when the test is done with them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []  # their Ray names, as the pool keeps them

    def give_back(self) -> None:
        POOL.give_back([(KEY, name, h, h.release.remote())
                        for name, h in zip(self.names, self, strict=True)])


def shard_actors(n: int, values: dict[str, torch.Tensor], spec: OptimizerSpec,
                 prefix: str = "r") -> Shards:
    """``n`` replicas of shard 0 holding ``values`` (replica ``i`` named ``{prefix}{i}``),
    each an idle pooled actor reset, or a new one."""
    blocks = make_layout(values, 1).shards[0]
    out = Shards()
    for i in range(n):
        replica = f"{prefix}{i}"

        args = (0, blocks, spec, values, replica)  # Ray copies the tensors per call

        def create(options: dict[str, Any], args: tuple[Any, ...] = args) -> tuple[str, Any]:
            name = f"test-shard-{uuid.uuid4().hex[:12]}"
            return name, ShardActor.options(name=name, **options).remote(  # type: ignore[attr-defined]
                *args)

        name, handle, reset = POOL.get(KEY, create,
                                       lambda _, h, args=args: h.reset.remote(*args))
        if reset is not None:
            ray.get(reset)  # before any chain call: a threaded actor keeps no call order
        out.append(handle)
        out.names.append(name)
    return out
