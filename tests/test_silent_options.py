"""Options that were accepted and then silently not used (issue 32's red-team pass):
each is now refused before the run, in one line, or honoured. Validation level only:
no process starts, no run trains (the resume case, which needs an interrupted run,
is in test_run_folders.py: test_resume_to_a_new_iteration_budget)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import check_together, parse
from trainthrough.lab.advise import advise_dp, trace_spec
from trainthrough.lab.runner import resolve_defaults
from trainthrough.lab.validate import validate_run


def _one_line(r: Any, *words: str) -> None:
    assert r.code == 2, (r.code, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainthrough: error: "), r.err
    assert "Traceback" not in r.out + r.err
    for w in words:
        assert w in r.err, r.err


# -- phase=recovery with no failure to recover from ------------------------------------
def test_a_recovery_phase_failure_with_nothing_to_recover_never_strikes() -> None:
    """Why it was dropped: a phase=recovery event waits for a recovery in progress,
    and a run with no other failure never has one."""
    sched = FailureSchedule(parse("rank=1@iter=3,phase=recovery"), {"rank": 4}, seed=0)
    for it in range(1, 1000):
        assert sched.due(it, float(it)) == []
    assert len(sched.pending) == 1 and sched.fired == []


@pytest.mark.parametrize("cfg", [
    RunConfig(paradigm="dp", strategy="diloco", failures=["rank=1@iter=3,phase=recovery"]),
    RunConfig(paradigm="dp", strategy="rollback", failures=["rank=1@iter=3,phase=recovery"]),
    RunConfig(failures=["shards=1@iter=3,phase=recovery"]),
    RunConfig(failures=["shard=any@mtbf=5s,phase=recovery"]),
])
def test_sim_refuses_a_recovery_phase_failure_nothing_else_causes(cfg: RunConfig) -> None:
    with pytest.raises(UserError, match="phase=recovery strikes only while another failure"):
        validate_run(cfg)


def test_a_recovery_phase_failure_with_a_cause_is_accepted() -> None:
    check_together(parse("rank=0@iter=2,phase=inner;rank=1@iter=3,phase=recovery"))
    validate_run(RunConfig(paradigm="dp", strategy="diloco",
                           failures=["rank=0@iter=2,phase=inner",
                                     "rank=1@iter=3,phase=recovery"]))


def test_gloo_still_refuses_the_phase_itself_first() -> None:
    with pytest.raises(UserError, match="gloo engine does not support failure phase"):
        validate_run(RunConfig(paradigm="dp", engine="gloo", strategy="diloco",
                               failures=["rank=1@iter=3,phase=recovery"]))


# -- a checkpoint interval where nothing is saved --------------------------------------
@pytest.mark.parametrize(("engine", "strategy", "flag"), [
    ("gloo", "localsgd", "checkpoint_every"), ("sim", "diloco", "checkpoint_every"),
    ("sim", "rollback", "checkpoint_every"), ("sim", "none", "checkpoint_keep"),
])
def test_checkpoint_settings_without_checkpoints_are_refused(engine: str, strategy: str,
                                                             flag: str) -> None:
    """As ``base=diloco,checkpoint=full`` is: nothing would be written."""
    paradigm = "ps" if strategy == "none" else "dp"
    cfg = RunConfig(paradigm=paradigm, engine=engine, strategy=strategy, **{flag: 2})
    with pytest.raises(UserError, match=f"--{flag.replace('_', '-')} has no effect with "
                                        f"strategy {strategy}.*writes them"):
        validate_run(cfg)


@pytest.mark.parametrize("strategy", ["localsgd", "rollback", "none", "checkpoint-restart"])
def test_a_resolved_config_is_valid_again(strategy: str) -> None:
    """config.toml holds every field resolved: it records no interval where nothing is
    saved, so running it again is not refused."""
    paradigm = "ps" if strategy in ("none", "checkpoint-restart") else "dp"
    resolved, w = resolve_defaults(RunConfig(paradigm=paradigm, strategy=strategy))
    saves = strategy == "checkpoint-restart"
    assert resolved.checkpoint_every == (w.default_checkpoint_every if saves else None)
    validate_run(RunConfig.from_dict(resolved.to_dict()))


def test_every_suite_sets_an_interval_only_where_it_is_read() -> None:
    from trainthrough.lab.suites import SUITES, build_suite

    for name in SUITES:
        for run in build_suite(name, quick=True).runs:
            validate_run(run.config)


# -- flags named at their default value -------------------------------------------------
def test_a_named_flag_the_run_does_not_read_is_refused_even_at_its_default() -> None:
    cfg = RunConfig(paradigm="dp", strategy="rollback")
    validate_run(cfg)  # from a config file, a field at its default is not a choice
    with pytest.raises(UserError, match="--shards is not used by the sim engine"):
        validate_run(cfg, named={"shards"})
    with pytest.raises(UserError, match="--sync-every has no effect with strategy rollback"):
        validate_run(cfg, named={"sync_every"})
    validate_run(cfg, named={"ranks", "seed", "engine"})


def test_run_refuses_shards_at_its_default_on_data_parallel(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    _one_line(cli("run", "--paradigm", "dp", "--strategy", "rollback", "--shards", "4",
                  "--out", str(out), "--quiet"), "--shards", "--paradigm dp")
    assert not out.exists()


# -- advise ----------------------------------------------------------------------------
def _never(cfg: RunConfig) -> RunResult:
    raise AssertionError("refused input reached a calibration run")


@pytest.mark.parametrize(("argv", "words"), [
    (["--paradigm", "dp", "--shards", "4"], ("--shards", "--paradigm dp")),
    (["--paradigm", "dp", "--workers", "4"], ("--workers", "--paradigm dp")),
    (["--paradigm", "ps", "--ranks", "4"], ("--ranks", "--paradigm ps")),
    (["--paradigm", "ps", "--sync-every", "10"], ("--sync-every",)),
    (["--paradigm", "dp", "--ranks", "1"], ("--ranks 1", "2 or more")),
    (["--paradigm", "dp", "--strategies", "rollback", "--sync-every", "5"],
     ("--sync-every", "relaxed")),
])
def test_advise_refuses_options_the_paradigm_does_not_use(argv: list[str], words: tuple[str, ...],
                                                          cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "advice"
    _one_line(cli("advise", *argv, "--mtbf", "10s", "--out", str(out), "--quiet"), *words)
    assert not out.exists()


def test_advise_gives_sync_every_to_the_relaxed_candidates_only() -> None:
    """Before, a --sync-every away from its default was handed to every candidate and
    the synchronous ones refused it: the advice could not run at all."""
    seen: list[RunConfig] = []

    def run(cfg: RunConfig) -> RunResult:
        seen.append(cfg)
        return RunResult(workload=cfg.workload, strategy=cfg.strategy, engine=cfg.engine,
                         seed=cfg.seed, metric_name="loss", target=1.0, direction="min",
                         converged=True, sim_seconds_to_target=5.0, sim_seconds=5.0,
                         failures=1 if cfg.failures else 0, final_metric=0.2,
                         extras={"samples_committed": 1000})

    cfg = RunConfig(paradigm="dp", sync_every=5)
    a = advise_dp(cfg, trace_spec("dp", "2s", None), only=["rollback", "diloco"], run=run,
                  named={"sync_every", "ranks"})
    assert {c.strategy: c.sync_every for c in seen} == {"rollback": 10, "diloco": 5}
    assert a.sync_every == 5
    with pytest.raises(UserError, match="2 or more"):
        advise_dp(replace(cfg, ranks=1), trace_spec("dp", "2s", None), run=_never)


# -- a device name with a newline ------------------------------------------------------
@pytest.mark.parametrize("name", ["cuda\n", "cpu\n", "cuda:0\n", "cuda:\u0663"])
def test_a_device_name_with_a_hidden_character_is_refused_showing_it(name: str) -> None:
    with pytest.raises(UserError) as e:
        RunConfig(paradigm="dp", engine="gloo", strategy="rollback",
                  device=name).check_relations()
    assert repr(name) in str(e.value) and "\n" not in str(e.value)


def test_the_command_line_shows_the_newline(cli, tmp_path: Path) -> None:  # noqa: ANN001
    _one_line(cli("run", "--paradigm", "dp", "--engine", "gloo", "--strategy", "rollback",
                  "--device", "cuda\n", "--out", str(tmp_path / "run"), "--quiet"),
              "--device 'cuda\\n'")
