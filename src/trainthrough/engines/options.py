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
                   "micro_batches", "replace", "ray_address", "bind_address",
                   "checkpoint_shared", "recovery_delay", "coordinator", "zookeeper_hosts",
                   "wall_limit", "device", "collective", "liveness_timeout", "max_restarts",
                   "straggler_deadline")

Scope = tuple[Callable[[str, Strategy], bool], str]  # (is it used?, what to say if not)
_SSP: Scope = (lambda consistency, s: consistency == "ssp",
               "only --consistency ssp has a staleness bound")
_CHAIN: Scope = (lambda consistency, s: s.replication != "none",
                 "only chain strategies keep replicas")
_ASYNC_CHAIN: Scope = (lambda consistency, s: s.replication == "chain-async",
                       "only an asynchronous chain lets its head run ahead")
_STATELESS: Scope = (lambda consistency, s: s.outage == "buffer",
                     "only the stateless outage (outage=buffer) buffers and merges a backlog")
_SAVES: Scope = (lambda consistency, s: s.checkpoint != "none",
                 "only a strategy with checkpoints (checkpoint=full or prioritized) "
                 "writes them")
_PRIORITIZED: Scope = (lambda consistency, s: s.checkpoint == "prioritized",
                       "only prioritized checkpoints save a chosen fraction of rows")
_RELAXED: Scope = (lambda consistency, s: s.relaxed,
                   "only a relaxed sync (localsgd, diloco, streaming-diloco) has outer steps")
_OUTER_OPT: Scope = (lambda consistency, s: s.sync in ("diloco", "streaming-diloco"),
                     "only diloco and streaming-diloco have an outer optimizer")
_STREAMING: Scope = (lambda consistency, s: s.sync == "streaming-diloco",
                     "only streaming-diloco cuts the model into fragments")

#: Settings that tune one mechanism, and when it is there.
MECHANISM_SETTINGS: dict[str, Scope] = {
    "staleness": _SSP, "replicas": _CHAIN, "checkpoint_every": _SAVES,
    "checkpoint_keep": _SAVES, "max_lag": _ASYNC_CHAIN,
    "merge_rule": _STATELESS, "merge_threshold": _STATELESS, "backlog": _STATELESS,
    "checkpoint_fraction": _PRIORITIZED, "checkpoint_rule": _PRIORITIZED,
    "sync_every": _RELAXED, "sync_fragments": _STREAMING, "outer_lr": _OUTER_OPT,
    "outer_momentum": _OUTER_OPT,
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
