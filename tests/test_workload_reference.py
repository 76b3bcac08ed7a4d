"""A model the project has never seen, in a file outside the package, runs by reference
on every engine (the driver, Ray actors and gloo ranks each import it themselves)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainthrough.cli import main

USER_CODE = '''
import torch
import torch.nn as nn

from trainthrough.workloads.custom import TorchWorkload


def build(seed: int, hidden: int = 16):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    return TorchWorkload(model, train=(x, y), test=(x, y), name="mine", target=0.8,
                         seed=seed, eval_every=5, max_iterations=400)
'''


@pytest.fixture
def user_file(tmp_path: Path) -> str:
    f = tmp_path / "elsewhere" / "my_model.py"
    f.parent.mkdir()
    f.write_text(USER_CODE)
    return f"{f}:build"


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_reference_runs_on_sim_ps_and_dp_with_a_failure(user_file: str, tmp_path: Path,
                                                        capsys) -> None:  # noqa: ANN001
    out = tmp_path / "ps"
    assert main(["run", "--workload", user_file, "--option", "hidden=12", "--quiet",
                 "--fail", "shards=1@iter=20", "--out", str(out)]) == 0, capsys.readouterr().err
    s = _summary(out)
    assert s["workload"] == "mine" and s["failures"] == 1 and s["converged"]
    dp = tmp_path / "dp"
    assert main(["run", "--workload", user_file, "--paradigm", "dp", "--strategy", "rollback",
                 "--fail", "rank=1@iter=10", "--quiet", "--out", str(dp)]) == 0
    assert _summary(dp)["failures"] == 1


def test_a_relative_reference_is_recorded_absolute(user_file: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(user_file.split(":")[0]).parent)
    out = tmp_path / "rel"
    assert main(["run", "--workload", "my_model.py:build", "--max-iterations", "10",
                 "--quiet", "--out", str(out)]) == 0
    assert f'workload = "{user_file}"' in (out / "config.toml").read_text()


def test_reference_from_python_c_on_gloo_ranks(user_file: str, tmp_path: Path) -> None:
    """Started from ``python -c`` (no main script for spawn to re-import): the gloo
    ranks import the user's file by its reference."""
    out = tmp_path / "gloo"
    code = ("import sys; from trainthrough.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "run", "--workload", user_file,
                        "--engine", "gloo", "--paradigm", "dp", "--ranks", "2",
                        "--strategy", "rollback", "--fail", "rank=1@iter=10",
                        "--recovery-delay", "0.1", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(out)
    assert s["workload"] == "mine" and s["failures"] == 1


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_reference_runs_on_ray_actors(user_file: str, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    assert main(["run", "--workload", user_file, "--engine", "ray", "--consistency", "async",
                 "--shards", "1", "--workers", "2", "--strategy", "checkpoint-sync",
                 "--fail", "shards=0@iter=20", "--recovery-delay", "0.2",
                 "--wall-limit", "40", "--quiet", "--out", str(out)]) == 0
    s = _summary(out)
    assert s["workload"] == "mine" and s["failures"] == 1 and s["recoveries"]


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("ray_session")
def test_reference_runs_data_parallel_on_ray_actors(user_file: str, tmp_path: Path) -> None:
    """The same file, data parallel: every rank a Ray actor that imports it itself; rank 1
    is SIGKILLed mid-allreduce and the survivor redoes the step."""
    pytest.importorskip("ray")
    out = tmp_path / "raydp"
    assert main(["run", "--workload", user_file, "--engine", "ray", "--paradigm", "dp",
                 "--ranks", "2", "--strategy", "rollback",
                 "--fail", "rank=1@iter=10,phase=allreduce:0", "--recovery-delay", "0.1",
                 "--quiet", "--out", str(out)]) == 0
    s = _summary(out)
    assert s["workload"] == "mine" and s["failures"] == 1
    assert s["recoveries"][0]["action"] == "mini-batch-rollback" and s["converged"]
    assert len(s["rank_nodes"]) == 2 and s["replicas_identical"]


@pytest.mark.parametrize("ref,words", [
    ("nowhere/missing.py:build", "does not exist"),
    ("json:no_such_factory", "no callable"),
    ("no_such_module_xyz:build", "cannot be imported"),
    ("just:a:b", "must be"),
])
def test_bad_references_are_one_line(ref: str, words: str, tmp_path: Path,
                                      capsys) -> None:  # noqa: ANN001
    assert main(["run", "--workload", ref, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_the_default_folder_is_named_after_the_file(user_file: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --out, ``runs/<time>-my_model-none``: not the reference's path, whose
    slashes and colon would nest folders."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--workload", user_file, "--strategy", "none",
                 "--max-iterations", "5", "--quiet"]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.endswith("-my_model-none") and (folder / "summary.json").exists()


SUITE_CODE = '''
from pathlib import Path

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec


def suite(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    model = f"{Path(__file__).with_name('my_model.py')}:build"
    fail = "shards=1@iter=20"
    runs = [SuiteRun(f"{s}-s{seed}", RunConfig(workload=model, strategy=s, failures=[fail],
                                               seed=seed, eval_every=1,
                                               checkpoint_every=10 if s != "none" else None,
                                               checkpoint_dir=f"memory://mine/{s}-{seed}"),
                     {"fail": fail})
            for s in ("none", "checkpoint-restart") for seed in range(seeds or 2)]
    return SuiteSpec(name="mine", title="My model, compared", runs=runs)


def not_a_suite(quick: bool = False, seeds: int | None = None) -> int:
    return 3
'''


def test_compare_runs_a_suite_by_reference_on_a_model_by_reference(
        user_file: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """``trainthrough compare --suite file.py:function``: the suite and the model it
    names both live outside the package; the runs (in other processes) import them."""
    suite_file = Path(user_file.split(":")[0]).with_name("my_suite.py")
    suite_file.write_text(SUITE_CODE)
    out = tmp_path / "cmp"
    code = main(["compare", "--suite", f"{suite_file}:suite", "--seeds", "1", "--quiet",
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "mine" in printed.out and "checkpoint-restart" in printed.out
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert sorted(r["strategy"] for r in rows) == ["checkpoint-restart", "none"]
    for r in rows:
        assert r["workload"] == "mine" and r["failures"] == "1", r
        assert int(r["iterations_to_target"]) > 0 and r["rework_iterations"] != "", r
    report = (out / "report.md").read_text()
    assert "My model, compared" in report and "| mine |" in report


@pytest.mark.parametrize("suite,words", [
    ("no-such-suite", "unknown suite"),
    ("nowhere/missing.py:suite", "suite file nowhere/missing.py does not exist"),
    ("MY_SUITE:not_a_suite", "must return a SuiteSpec"),
])
def test_bad_suites_are_one_line(suite: str, words: str, user_file: str, tmp_path: Path,
                                 capsys) -> None:  # noqa: ANN001
    suite_file = Path(user_file.split(":")[0]).with_name("my_suite.py")
    suite_file.write_text(SUITE_CODE)
    suite = suite.replace("MY_SUITE", str(suite_file))
    assert main(["compare", "--suite", suite, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
