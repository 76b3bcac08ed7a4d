"""The SCAR suite's grid, its shared failure-free twin, and its report with intervals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainthrough.config import RunConfig
from trainthrough.lab.runner import run_silent
from trainthrough.lab.suite import SuiteSpec, run_suite
from trainthrough.lab.suites import scar


def test_the_full_grid_has_ten_seeds_every_strategy_and_late_failures() -> None:
    spec = scar.build()
    cells: dict[tuple[str, str, str], set[int]] = {}
    for r in spec.runs:
        cells.setdefault((r.config.workload, r.labels["fraction"], r.labels["strategy"]),
                         set()).add(r.config.seed)
    assert all(seeds == set(range(scar.SEEDS if s in scar.STRATEGIES else scar.ABLATION_SEEDS))
               for (_, _, s), seeds in cells.items())
    assert scar.SEEDS >= 10
    for w, st in scar.SETTINGS.items():
        # 80% of the way through an interval, after at least one checkpoint
        assert st.fail_at > st.every and st.fail_at % st.every == round(0.8 * st.every)
        for f in scar.FRACTIONS:
            assert all((w, f, s) in cells for s in scar.STRATEGIES)
    assert spec.intervals and spec.baseline_strategy == scar.STRATEGIES[0]


def test_a_strategy_added_to_the_list_gets_rows_everywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scar, "STRATEGIES", (*scar.STRATEGIES, "none"))
    spec = scar.build(quick=True)
    assert {r.config.strategy for r in spec.runs if r.labels["strategy"] == "none"} == {"none"}


def test_strategies_train_identically_without_failures_so_one_twin_serves_all() -> None:
    st = scar.SETTINGS["mf"]
    base = RunConfig(workload="mf", seed=1, checkpoint_every=st.every,
                     eval_every=st.eval_every, workload_options=dict(st.options))
    runs = [run_silent(replace(base, strategy=s, checkpoint_fraction=r, checkpoint_rule=rule))
            for s, rule, r in [("checkpoint-restart", "largest-change", 0.25),
                               ("scar", "largest-change", 0.25), ("scar", "random", None)]]
    assert len({(s.iterations_to_target, s.final_metric) for s in runs}) == 1
    twin = scar.failure_free_twin(replace(base, strategy="scar", checkpoint_rule="random",
                                          failures=["shards=50%@iter=45"]))
    assert twin.failures == [] and twin.strategy == scar.BASELINE


def test_checkpoint_restart_reworks_the_20_iterations_it_rolls_back_on_mf() -> None:
    st = scar.SETTINGS["mf"]
    cfg = RunConfig(workload="mf", strategy="checkpoint-restart", seed=0,
                    checkpoint_every=st.every, eval_every=st.eval_every,
                    workload_options=dict(st.options))
    free = run_silent(cfg).iterations_to_target
    hit = run_silent(replace(cfg, failures=[f"shards=50%@iter={st.fail_at}"]))
    assert free > st.fail_at + 20  # the failure strikes well before convergence
    assert hit.iterations_to_target - free == st.fail_at % st.every == 20


def test_the_report_gives_every_cell_an_interval_and_the_headline(tmp_path: Path) -> None:
    full = scar.build(quick=True, seeds=3)
    runs = [r for r in full.runs if r.config.workload == "mf"
            and r.labels["strategy"] in scar.STRATEGIES]
    spec = SuiteSpec(**{**full.__dict__, "runs": runs})
    table = run_suite(spec, tmp_path / "s", quiet=True)
    assert "95% CI" in table
    md = (tmp_path / "s" / "report.md").read_text()
    assert (tmp_path / "s" / "plots" / "reductions.png").stat().st_size > 0
    rows = [ln for ln in md.splitlines() if ln.startswith("| mf | 50% | scar")]
    assert len(rows) == 2 and all("% [" in ln for ln in rows)
    headline = [ln for ln in md.splitlines() if ln.startswith("| mf | scar | 3")]
    assert len(headline) == 1 and headline[0].startswith("| mf | scar | 3 | ")  # 3 pairs


def test_environment_variables_point_workloads_at_real_data(tmp_path: Path) -> None:
    import numpy as np

    from trainthrough.errors import UserError
    from trainthrough.lab.suites.scar_data import real_data_options
    from trainthrough.workloads.idx import write_idx

    (tmp_path / "u.data").write_text("1\t1\t5\t0\n1\t2\t3\t0\n2\t1\t4\t0\n")
    (tmp_path / "docword.kos.txt").write_text("2\n3\n3\n1 1 2\n1 3 1\n2 2 4\n")
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
    for n in names:
        write_idx(tmp_path / n, np.zeros((4, 8, 8) if "images" in n else (4,), np.uint8))
    opts = real_data_options({"TT_MOVIELENS": str(tmp_path / "u.data"),
                              "TT_UCI_BOW": str(tmp_path / "docword.kos.txt"),
                              "TT_MNIST": str(tmp_path)})
    assert opts["mf"] == {"ratings_file": str(tmp_path / "u.data")}
    assert opts["lda"]["docword_file"] == str(tmp_path / "docword.kos.txt")
    assert opts["cnn"]["train_images"] == str(tmp_path / names[0])
    assert opts["cnn"]["metric"] == "loss" and opts["mlr"]["test_labels"] == str(
        tmp_path / names[3])
    assert real_data_options({}) == {}
    with pytest.raises(UserError, match="TT_MOVIELENS"):
        real_data_options({"TT_MOVIELENS": str(tmp_path / "nope")})
    (tmp_path / names[3]).unlink()
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte"):
        real_data_options({"TT_MNIST": str(tmp_path)})


def test_the_suite_runs_mf_on_the_ratings_file_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "u.data").write_text("1\t1\t5\t0\n1\t2\t3\t0\n2\t1\t4\t0\n")
    monkeypatch.setenv("TT_MOVIELENS", str(tmp_path / "u.data"))
    spec = scar.build(quick=True)
    mf = [r.config for r in spec.runs if r.config.workload == "mf"]
    assert mf and all(c.workload_options == {"ratings_file": str(tmp_path / "u.data")}
                      for c in mf)
    assert any("Real data for mf" in n for n in spec.notes)
