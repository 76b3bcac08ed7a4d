"""Which run settings a run actually uses, and the check that refuses the rest.

A setting a run would not read (``--wall-limit`` on the virtual-clock ``sim`` engine,
``--replicas`` without a chain, ``--staleness`` under bulk-synchronous rounds) is not
accepted and dropped: it is refused before the run, in one line naming what uses it.
A field left at its default is never refused, so a ``config.toml`` written by a run
(every field resolved) stays re-runnable as is.

Two kinds of scope:

- *engine settings* (:data:`ENGINE_SETTINGS`): whether the engine reads them is the
  engine's fact, declared in its capabilities per paradigm (``options=``);
- *mechanism settings* (:data:`MECHANISM_SETTINGS`): read only when the strategy or the
  consistency model has the mechanism they tune; that holds on every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainthrough.ft.strategy import Strategy

#: Settings only some engines read (per paradigm): each engine lists those it reads
#: in its capabilities (``options``).
ENGINE_SETTINGS = ("shards", "workers", "ranks", "elastic", "allreduce_buckets",
                   "micro_batches", "replace", "ray_address", "recovery_delay", "coordinator",
                   "zookeeper_hosts", "wall_limit")

#: Settings that tune one mechanism: (when it is used, what to say when it is not).
MECHANISM_SETTINGS: dict[str, tuple[Callable[[str, Strategy], bool], str]] = {
    "staleness": (lambda consistency, s: consistency == "ssp",
                  "only --consistency ssp has a staleness bound"),
    "replicas": (lambda consistency, s: s.replication != "none",
                 "only chain strategies keep replicas"),
    "max_lag": (lambda consistency, s: s.replication == "chain-async",
                "only an asynchronous chain lets its head run ahead"),
    "merge_rule": (lambda consistency, s: s.outage == "buffer",
                   "only the stateless outage (outage=buffer) merges a backlog"),
    "merge_threshold": (lambda consistency, s: s.outage == "buffer",
                        "only the stateless outage (outage=buffer) merges a backlog"),
    "backlog": (lambda consistency, s: s.outage == "buffer",
                "only the stateless outage (outage=buffer) buffers updates"),
    "checkpoint_fraction": (lambda consistency, s: s.checkpoint == "prioritized",
                            "only prioritized checkpoints save a fraction"),
    "checkpoint_rule": (lambda consistency, s: s.checkpoint == "prioritized",
                        "only prioritized checkpoints choose rows"),
}


def unused_engine_settings(options: frozenset[str], changed: Mapping[str, Any]) -> list[str]:
    """The engine settings in ``changed`` (fields away from their defaults) that an
    engine reading ``options`` would not read, in field order."""
    return [k for k in ENGINE_SETTINGS if k in changed and k not in options]


def unused_mechanism_settings(consistency: str, strategy: Strategy,
                              changed: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, why) for each mechanism setting in ``changed`` the run has no use for."""
    return [(k, why) for k, (used, why) in MECHANISM_SETTINGS.items()
            if k in changed and not used(consistency, strategy)]
