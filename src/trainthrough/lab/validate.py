"""The whole check of a run config before anything is built: :func:`validate_run`.

:meth:`RunConfig.validate <trainthrough.config.RunConfig.validate>` checks what the
config alone can tell (each field's type and bounds, the rules between fields). What
the names in it refer to is checked here, in the layer that may import them all: the
workload (an unknown name, a broken reference, its options), the strategy and whether
it runs on the paradigm, the failure specs, and what the chosen engine claims
(``engines/registry.py``: a combination it does not run, a setting it would not read).

Contract: every run goes through :func:`validate_run` before it starts (the runner,
``compare``'s suites, ``advise``, ``trainthrough run``, ``trainthrough.loop.launch``
through the runner); it raises one :class:`~trainthrough.errors.UserError` naming the
setting to change, in the same order as ever: fields first, then the workload,
strategy, failures and engine, then the rules between fields.

Importing this module imports no torch (the command line's parser imports the suites,
which import it): what the checks need is imported when they run.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields, replace
from typing import Any

from trainthrough.config import RunConfig, flag_label
from trainthrough.errors import UserError
from trainthrough.fields import check_fields


def validate_run(cfg: RunConfig, named: Collection[str] = ()) -> None:
    """Check everything about ``cfg`` that can be checked before a run starts.

    Args:
        cfg: the configuration.
        named: the fields the caller set by name (the command line's flags): one the run
            would not read is refused even at its default value (``--shards 4`` with
            ``--paradigm dp``), where a field of a config file at its default is not
            (a recorded ``config.toml`` holds every field).

    Raises:
        UserError: naming the field (as its command-line flag) and what to change.
    """
    # Layers below this one, imported here only to keep importing this module cheap.
    from trainthrough.engines.registry import check_settings, check_supported, names, traits
    from trainthrough.faults.spec import check_together, parse
    from trainthrough.ft.strategy import resolve
    from trainthrough.workloads import workload_factory
    from trainthrough.workloads.options import check_options
    from trainthrough.workloads.user_loop import TrainingLoop

    # Each field's type and bounds first: everything below reads them.
    check_fields(cfg, flag_label)
    factory = workload_factory(cfg.workload)  # unknown names, broken references: one line
    # A user's loop: only ranks run it.
    if isinstance(factory, TrainingLoop) and (cfg.paradigm != "dp"
                                              or not traits(cfg.engine).hosts_processes):
        hosts = " or ".join(n for n in names() if traits(n).hosts_processes)
        raise UserError(f"{cfg.workload} is your own training loop: run it with "
                        f"--paradigm dp --engine {hosts}")
    check_options(cfg.workload, cfg.workload_options)  # a loop's: train()'s parameters
    if cfg.paradigm == "dp" and traits(cfg.engine).hosts_processes:  # real devices, collective
        from trainthrough.dp.devices import cuda_count, plan_devices

        plan_devices(cfg.device, cfg.collective, isinstance(factory, TrainingLoop), cfg.ranks,
                     cuda_count())
    strategy = resolve(cfg.strategy)
    strategy.require(cfg.paradigm)
    specs = parse(cfg.failures)
    # The chosen engine says what it runs; everything else is refused here.
    check_supported(cfg.engine, cfg.paradigm, cfg.consistency, strategy, specs)
    check_together(specs)  # a spec the engine runs may still wait for one never given
    # A setting the run would not read is refused, never dropped (engines/options.py).
    check_settings(cfg.engine, cfg.paradigm, cfg.consistency, strategy,
                   {**cfg.changed_fields(), **{k: getattr(cfg, k) for k in named}})
    cfg.check_relations()
    if cfg.straggler_deadline is not None and strategy.relaxed:
        raise UserError(f"--straggler-deadline applies to every-step sync: strategy "
                        f"{cfg.strategy} waits for its peers only at outer "
                        "steps, which have no deadline; drop it")
    _check_checkpoints_reach_every_host(cfg, strategy.recovery == "rollback-all")


def for_strategy(cfg: RunConfig, strategy: str) -> RunConfig:
    """``cfg`` run with ``strategy``, its mechanism settings that strategy does not read
    (engines/options.py: a checkpoint interval where nothing is saved, ``sync_every``
    without outer steps) back at their defaults.

    For a base shared by several strategies (a suite's cells, the advisor's candidates),
    each run reading its own share of it; never for a user's own configuration, whose
    settings :func:`validate_run` refuses where unread.

    Raises:
        UserError: an unknown strategy.
    """
    from trainthrough.engines.options import MECHANISM_SETTINGS
    from trainthrough.ft.strategy import resolve

    s = resolve(strategy)
    defaults: dict[str, Any] = {f.name: f.default for f in fields(RunConfig)}
    return replace(cfg, strategy=strategy,
                   **{k: defaults[k] for k, (used, _) in MECHANISM_SETTINGS.items()
                      if not used(cfg.consistency, s)})


#: fsspec protocols whose files only the machine that wrote them can read.
_HOST_LOCAL = ("file", "local", "memory")


def _check_checkpoints_reach_every_host(cfg: RunConfig, restores: bool) -> None:
    """A data-parallel checkpoint-restart on a cluster it joins (``--ray-address``: ranks
    may run, and restart, on any host) must restore from storage every host reaches: an
    fsspec URL of shared storage, or a folder the user declares shared. A local path is
    refused rather than restored from a folder another host cannot see.

    Raises:
        UserError: one line naming what to pass.
    """
    from trainthrough.engines.registry import traits

    if not (restores and cfg.paradigm == "dp" and traits(cfg.engine).on_ray
            and cfg.ray_address):
        return
    where = cfg.checkpoint_dir
    protocol = where.split("://", 1)[0] if where and "://" in where else "file"
    if protocol not in _HOST_LOCAL or (cfg.checkpoint_shared and where):
        return
    raise UserError(f"checkpoint-restart on a Ray cluster restores on any host, so its "
                    f"checkpoints must be where every host reaches them, not "
                    f"{where or 'the run folder'} on this machine: pass --checkpoint-dir "
                    f"with an fsspec URL of shared storage (e.g. s3://bucket/run), or a folder "
                    f"every host mounts with --checkpoint-shared")
