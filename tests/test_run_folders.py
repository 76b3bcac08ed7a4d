"""Run folders never lie and never block: status, --overwrite, --resume (sim engine).

A run that ends early is marked (``status.json``) and has no ``summary.json``; a used
folder is refused in one line unless ``--overwrite`` (which removes only what a run
wrote) or ``--resume`` (which continues the run from its newest checkpoint and must
end exactly where the uninterrupted run of the same seed ends).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.signals import identify
from trainthrough.errors import Terminated, UserError
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.lab.run_folder import inspect
from trainthrough.lab.runner import run

from .conftest import read_metrics, read_summary

# Small and fast: checkpoints at 20 and 40 before the cut at 47; the run ends at 60.
KW: dict[str, Any] = dict(workload="mlr", max_iterations=60, checkpoint_every=20, eval_every=10,
                          stop_at_target=False)


class _Stop(Callback):
    """Ends the run after executed iteration ``at`` by raising ``error``."""

    def __init__(self, at: int, error: BaseException) -> None:
        self.at, self.error = at, error

    def after_step(self, iteration: int, sim_seconds: float) -> None:
        if iteration == self.at:
            raise self.error


def _cut(out: Path, at: int = 47, error: BaseException | None = None,
         **kw: Any) -> None:
    with pytest.raises(type(error or KeyboardInterrupt())):
        run(RunConfig(**{**KW, **kw}), out, [_Stop(at, error or KeyboardInterrupt())])


def _status(out: Path) -> dict[str, Any]:
    return json.loads((out / "status.json").read_text())  # type: ignore[no-any-return]


def _one_line_error(r: Any, *words: str) -> None:
    assert r.code == 2, r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    for w in words:
        assert w in r.err, r.err


# -- an incomplete run is marked so -------------------------------------------------
@pytest.mark.parametrize(("error", "state", "reason"), [
    (KeyboardInterrupt(), "interrupted", "SIGINT"),
    (Terminated(), "interrupted", "SIGTERM"),
    (RuntimeError("disk on fire"), "failed", "RuntimeError: disk on fire"),
])
def test_a_run_that_ends_early_is_marked_and_has_no_summary(
        tmp_path: Path, error: BaseException, state: str, reason: str) -> None:
    out = tmp_path / "run"
    _cut(out, error=error)
    st = _status(out)
    assert st["state"] == state and reason in st["reason"] and st["run_id"]
    assert not (out / "summary.json").exists()
    seen = [m["iteration"] for m in read_metrics(out)]
    assert seen[0] == 0 and max(seen) <= 47 and seen == sorted(seen)  # the curve so far
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())


def test_a_checkpoint_the_disk_cannot_take_is_said_and_the_run_goes_on(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The disk fills up from the second save (iteration 40) on: the run trains on to
    its end from the save written, and says so in one line when it happens (also with
    --quiet) and how many in all at the end; events.jsonl lists each failed save, the
    summary counts them, and nothing half written is left."""
    import errno

    real = CheckpointStore._open_write

    def full(self: CheckpointStore, path: str) -> Any:
        if "-00000020.tmp-" not in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(self, path)

    monkeypatch.setattr(CheckpointStore, "_open_write", full)
    out = tmp_path / "run"
    r = cli("run", "--workload", "mlr", "--max-iterations", "60", "--checkpoint-every", "20",
            "--target", "0.0001", "--strategy", "checkpoint-restart", "--quiet",
            "--out", str(out))
    assert r.code == 0, r.err
    assert "Traceback" not in r.err
    lines = [x for x in r.err.splitlines() if "warning" in x]
    assert lines[0].startswith("trainthrough: warning: a checkpoint at iteration 40 was not "
                               "written: checkpoint shard0-00000040 could not be written to "), r.err
    assert "No space left on device" in lines[0] and "goes on" in lines[0]
    failed = [e for e in (json.loads(x) for x in (out / "events.jsonl").read_text().splitlines())
              if e["type"] == "checkpoint-failed"]
    s = read_summary(out)
    assert sorted({e["iteration"] for e in failed}) == [40, 60]  # each shard's, 4 each
    assert len(failed) == 8 and s["checkpoints_failed"] == 2
    assert lines[1] == ("trainthrough: warning: 2 checkpoint saves failed in this run "
                        "(events.jsonl: checkpoint-failed)") and len(lines) == 2
    assert s["checkpoints"] == 1 and s["iterations"] == 60 and _status(out)["state"] == "complete"
    folders = sorted(p.name for p in (out / "checkpoints").glob("run-*/*"))
    assert folders and all(f.endswith("-00000020") for f in folders), folders  # none half
    store = CheckpointStore(str(next((out / "checkpoints").glob("run-*"))))  # written left
    latest = store.load_latest("shard0")
    assert latest is not None and latest[1].step == 20  # and the one before verifies


def test_a_complete_run_says_so(tmp_path: Path) -> None:
    s = run(RunConfig(**KW), tmp_path / "run")
    st = _status(tmp_path / "run")
    assert st["state"] == "complete" and st["reason"] is None and st["run_id"] == s.run_id
    # summary.json is what run() returned, flat: the result (its extras among its
    # fields), the run's identity and the rework fields (null here: no baseline).
    written = read_summary(tmp_path / "run")
    assert written == json.loads(json.dumps(s.to_dict()))
    assert written["iterations"] == s.result.iterations == 60 and written["run_id"] == s.run_id
    assert "extras" not in written and set(s.result.extras) <= set(written)
    assert {"recoveries", "checkpoint_url", "rework_iterations", "rework_bound",
            "baseline_iterations_to_target", "contraction"} <= set(written)


def test_sigterm_on_the_command_marks_the_folder(tmp_path: Path) -> None:
    """A real process: SIGTERM ends it with 143 and the folder says interrupted; then
    the same process SIGKILLed leaves 'running', which a rerun reads as killed."""
    cfg = tmp_path / "long.toml"
    cfg.write_text('workload = "ridge"\nmax_iterations = 10000000\nstop_at_target = false\n'
                   "eval_every = 50\n")

    def start(out: Path) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "trainthrough.cli", "run", "--quiet",
                              "--config", str(cfg), "--out", str(out)],
                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").stat().st_size:
            assert p.poll() is None and time.time() < deadline, "the run did not start"
            time.sleep(0.05)
        return p

    p = start(tmp_path / "term")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "--resume" in err and len(err.strip().splitlines()) == 1
    st = _status(tmp_path / "term")
    assert st["state"] == "interrupted" and "SIGTERM" in st["reason"]
    assert not (tmp_path / "term" / "summary.json").exists()

    p = start(tmp_path / "kill")
    killed = inspect(tmp_path / "kill")
    assert killed is not None and killed.alive  # refused while it runs
    p.kill()
    p.communicate(timeout=60)
    killed = inspect(tmp_path / "kill")
    assert killed is not None and killed.state == "running" and not killed.alive
    assert "killed?" in killed.describe()


# -- reusing a folder ---------------------------------------------------------------
def test_a_used_folder_is_refused_in_one_line(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    _cut(out)
    r = cli("run", "--workload", "mlr", "--out", str(out), "--quiet")
    _one_line_error(r, "already exists", "interrupted run", "--overwrite", "--resume")
    run(RunConfig(**KW), tmp_path / "done")
    r = cli("run", "--workload", "mlr", "--out", str(tmp_path / "done"), "--quiet")
    _one_line_error(r, "complete run", "--overwrite")
    assert "--resume" not in r.err


def test_overwrite_replaces_the_run_and_keeps_a_users_files(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    _cut(out)
    old = _status(out)["run_id"]
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "my-weights.bin").write_bytes(b"mine too")
    r = cli("run", "--workload", "mlr", "--max-iterations", "30", "--checkpoint-every", "20",
            "--out", str(out), "--overwrite", "--quiet")
    assert r.code == 0, r.err
    s = read_summary(out)
    assert s["run_id"] != old and s["iterations"] <= 30 and _status(out)["state"] == "complete"
    assert not (out / "checkpoints" / f"run-{old}").exists()  # the old run's own checkpoints
    assert (out / "checkpoints" / f"run-{s['run_id']}").is_dir()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "checkpoints" / "my-weights.bin").read_bytes() == b"mine too"
    assert not any("resumed" in line for line in (out / "events.jsonl").read_text().splitlines())
    assert max(m["iteration"] for m in read_metrics(out)) <= 30  # the old curve is gone


def test_overwrite_removes_the_old_runs_checkpoints_from_a_checkpoint_dir_given(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """With ``--checkpoint-dir`` (relative, as typed): the old run's location there goes,
    the user's files there stay. Before, --overwrite read the folder config.toml names
    after deleting config.toml, and looked in the default folder instead."""
    monkeypatch.chdir(tmp_path)
    Path("mine").mkdir()
    Path("mine/weights.bin").write_bytes(b"mine")
    args = ("run", "--workload", "mlr", "--max-iterations", "20", "--checkpoint-every", "10",
            "--checkpoint-dir", "mine", "--out", "run", "--quiet")
    assert cli(*args).code == 0  # short of the target after 20 iterations: still 0
    old = _status(Path("run"))["run_id"]
    assert Path("mine", f"run-{old}").is_dir()
    assert cli(*args, "--overwrite").code == 0
    new = _status(Path("run"))["run_id"]
    assert sorted(p.name for p in Path("mine").iterdir()) == [f"run-{new}", "weights.bin"]
    assert Path("mine/weights.bin").read_bytes() == b"mine"


@pytest.mark.parametrize(("where", "words"), [
    ("file", "is a file, not a folder"),
    ("file/sub", "which is a file"),
])
def test_a_checkpoint_dir_that_cannot_be_a_folder_is_refused_before_the_run(
        where: str, words: str, cli, tmp_path: Path) -> None:  # noqa: ANN001
    """Before, the first save raised NotADirectoryError with a traceback, exit 1."""
    (tmp_path / "file").write_text("a user's file")
    r = cli("run", "--workload", "mlr", "--checkpoint-every", "2", "--checkpoint-dir",
            str(tmp_path / where), "--out", str(tmp_path / "run"), "--quiet")
    _one_line_error(r, "--checkpoint-dir", words)
    assert not (tmp_path / "run").exists()
    assert (tmp_path / "file").read_text() == "a user's file"


def test_overwrite_refuses_a_folder_that_holds_no_run(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    r = cli("run", "--workload", "mlr", "--out", str(out), "--overwrite", "--quiet")
    _one_line_error(r, "not a trainthrough run")
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_a_run_still_running_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _cut(out)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = identify(sleeper.pid)  # the sleeper as a run process records itself
        assert me is not None
        st = {**_status(out), "state": "running", "pid": sleeper.pid,
              "pid_start": me.start_ticks}
        (out / "status.json").write_text(json.dumps(st))
        for flags in ({"overwrite": True}, {"resume": True}):
            with pytest.raises(UserError, match="still running"):
                run(RunConfig(**KW), out, **flags)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_reused_pid_is_not_taken_for_the_run(tmp_path: Path) -> None:
    """The recorded pid is alive, but it started at another time: another process."""
    out = tmp_path / "run"
    _cut(out)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = identify(sleeper.pid)
        assert me is not None
        st = {**_status(out), "state": "running", "pid": sleeper.pid,
              "pid_start": me.start_ticks + 1}
        (out / "status.json").write_text(json.dumps(st))
        assert run(RunConfig(**KW), out, overwrite=True).result.iterations == 60
    finally:
        sleeper.kill()
        sleeper.wait()


# -- resuming -----------------------------------------------------------------------
def _final_tensors(out: Path, run_id: str, tag: str) -> dict[str, torch.Tensor]:
    store = CheckpointStore(str(out / "checkpoints" / f"run-{run_id}"))
    tensors, info = store.load(store.list(tag)[-1], tag)
    assert info.step == 60
    return tensors


@pytest.mark.parametrize("paradigm", ["ps", "dp"])
def test_resume_ends_where_the_uninterrupted_run_ends(cli, tmp_path: Path,  # noqa: ANN001
                                                      paradigm: str) -> None:
    full = run(RunConfig(**KW, paradigm=paradigm, seed=3), tmp_path / "full")
    out = tmp_path / "cut"
    _cut(out, paradigm=paradigm, seed=3)
    run_id = _status(out)["run_id"]
    r = cli("run", "--out", str(out), "--resume", "--quiet")
    assert r.code == 0, r.err
    s = read_summary(out)
    assert s["run_id"] == run_id and s["resumed_from"] == 40  # the newest checkpoint, not 0
    assert s["iterations"] == full.result.iterations == 60
    assert s["final_metric"] == full.result.final_metric
    # The curve: the first part up to the cut, the resume marked, then the second part,
    # whose every evaluation equals the uninterrupted run's at that iteration.
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert [e["iteration"] for e in resumed] == [40]
    its = [m["iteration"] for m in read_metrics(out)]
    back = next(i for i in range(1, len(its)) if its[i] <= its[i - 1])  # where it resumed
    first, second = read_metrics(out)[:back], read_metrics(out)[back:]
    assert 40 <= first[-1]["iteration"] <= 47 and second[0]["iteration"] == 40
    assert second[-1]["iteration"] == 60
    expected = {m["iteration"]: m["metric"] for m in read_metrics(tmp_path / "full")}
    common = [m for m in second if m["iteration"] in expected]
    assert len(common) >= 2 and {60} <= {m["iteration"] for m in common}
    assert [m["metric"] for m in common] == [expected[m["iteration"]] for m in common]
    # The parameters themselves: the last checkpoint (iteration 60) of both runs.
    tag = "shard0" if paradigm == "ps" else "ckpt"
    a, b = _final_tensors(tmp_path / "full", full.run_id, tag), _final_tensors(out, run_id, tag)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _status(out)["state"] == "complete"


def test_resume_refusals(cli, tmp_path: Path) -> None:  # noqa: ANN001
    early = tmp_path / "early"
    _cut(early, at=15)  # before the first checkpoint
    _one_line_error(cli("run", "--out", str(early), "--resume", "--quiet"),
                    "saved no checkpoint", "--overwrite")
    cut = tmp_path / "cut"
    _cut(cut)
    _one_line_error(cli("run", "--out", str(cut), "--resume", "--seed", "5", "--quiet"),
                    "--seed is 0, not 5")
    _one_line_error(cli("run", "--out", str(cut), "--resume", "--config", "x.toml", "--quiet"),
                    "drop --config")
    _one_line_error(cli("run", "--resume", "--quiet"), "needs --out")
    _one_line_error(cli("run", "--out", str(cut), "--resume", "--overwrite", "--quiet"),
                    "not allowed with")
    assert _status(cut)["state"] == "interrupted"  # refusals touch nothing
    # Options that repeat the recorded values are no conflict.
    r = cli("run", "--out", str(cut), "--resume", "--workload", "mlr", "--max-iterations",
            "60", "--quiet")
    assert r.code == 0, r.err
    _one_line_error(cli("run", "--out", str(cut), "--resume", "--quiet"),
                    "is complete", "--overwrite")
    _one_line_error(cli("run", "--out", str(tmp_path / "nothing"), "--resume", "--quiet"),
                    "holds no trainthrough run")


def test_a_run_resumes_from_another_working_folder(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Relative --out and --checkpoint-dir, typed in one folder, resumed from another:
    the run records its checkpoint folder absolute. Before, it recorded it as typed
    and the resumed run looked for it under the new working folder."""
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    for ckpt in ("ck", None):
        out = Path(f"cut-{ckpt}")
        _cut(out, **({"checkpoint_dir": ckpt} if ckpt else {}))
        recorded = RunConfig.from_toml(out / "config.toml").checkpoint_dir
        assert recorded is not None and Path(recorded).is_absolute()
    monkeypatch.chdir(tmp_path)
    for ckpt in ("ck", None):
        r = cli("run", "--out", f"a/cut-{ckpt}", "--resume", "--quiet")
        assert r.code == 0, r.err
        assert read_summary(Path(f"a/cut-{ckpt}"))["resumed_from"] == 40
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["ck", "cut-None", "cut-ck"]


def test_resume_to_a_new_iteration_budget(cli, tmp_path: Path) -> None:  # noqa: ANN001
    """``--max-iterations`` may change on a resume (lab/resume.py): the run goes on to
    the new budget exactly as a run started with it, and records it; a budget the
    newest checkpoint already passed is refused, naming its step (before, it was
    accepted: sim ended the run past its budget, gloo trained on); one at the step ends
    the run at once, where it resumed."""
    longer = run(RunConfig(**{**KW, "max_iterations": 90}), tmp_path / "longer")
    out = tmp_path / "cut"
    _cut(out)  # budget 60, newest checkpoint 40
    r = cli("run", "--out", str(out), "--resume", "--max-iterations", "90", "--quiet")
    assert r.code == 0, r.err
    s = read_summary(out)
    assert s["resumed_from"] == 40 and s["iterations"] == 90
    assert s["final_metric"] == longer.result.final_metric
    assert RunConfig.from_toml(out / "config.toml").max_iterations == 90
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["max_iterations"] for e in events if e["type"] == "resumed"] == [90]

    short = tmp_path / "short"
    _cut(short)
    _one_line_error(cli("run", "--out", str(short), "--resume", "--max-iterations", "1",
                        "--quiet"), "newest checkpoint", "at step 40", "--max-iterations 1")
    assert _status(short)["state"] == "interrupted"  # the refusal touched nothing
    r = cli("run", "--out", str(short), "--resume", "--max-iterations", "40", "--quiet")
    assert r.code == 0, r.err
    s = read_summary(short)
    assert s["resumed_from"] == 40 and s["iterations"] == 40
    assert _status(short)["state"] == "complete"


@pytest.mark.parametrize(("engine", "paradigm", "strategy", "words"), [
    ("ray", "ps", "checkpoint-restart", "the ray engine cannot resume"),
    ("gloo", "dp", "rollback", "keeps no checkpoints"),  # gloo resumes dp (test_loop)
    ("sim", "ps", "none", "keeps no checkpoints"),
])
def test_engines_that_cannot_resume_refuse_before_the_run(
        tmp_path: Path, engine: str, paradigm: str, strategy: str, words: str) -> None:
    from trainthrough.engines.registry import check_resumable
    from trainthrough.ft.strategy import resolve

    with pytest.raises(UserError, match=words):
        check_resumable(engine, paradigm, resolve(strategy))
    out = tmp_path / "cut"
    _cut(out)
    with pytest.raises(UserError, match=words):
        # No interval for a strategy that saves nothing (it would be refused as unread).
        every = KW["checkpoint_every"] if resolve(strategy).checkpoint != "none" else None
        run(RunConfig(**{**KW, "engine": engine, "paradigm": paradigm, "strategy": strategy,
                         "checkpoint_every": every}), out, resume=True)
    assert _status(out)["state"] == "interrupted"


# -- readers --------------------------------------------------------------------------
def test_the_suite_report_leaves_incomplete_runs_out_and_says_so(tmp_path: Path) -> None:
    from trainthrough.lab.report import _auto_notes

    suite = tmp_path / "suite"
    run(RunConfig(**KW), suite / "runs" / "a")
    _cut(suite / "runs" / "b")
    notes = _auto_notes(suite, [{"run_id": "a"}, {"run_id": "b"}], "checkpoint-restart")
    line = next(n for n in notes if "incomplete" in n)
    assert line.endswith(": b.")
    assert os.path.exists(suite / "runs" / "b" / "metrics.jsonl")


# The command line and launch() take a resume's rules from one place (lab/resume.py):
# each change below is accepted by both or refused by both.
_CHANGES = [
    (["--max-iterations", "90"], {"max_iterations": 90}, True),
    (["--wall-limit", "100"], {"wall_limit": 100.0}, True),
    (["--fail", "shards=1@iter=50"], {"failures": ["shards=1@iter=50"]}, True),
    (["--seed", "5"], {"seed": 5}, False),
    (["--shards", "3"], {"shards": 3}, False),
    (["--checkpoint-every", "10"], {"checkpoint_every": 10}, False),
]


@pytest.mark.parametrize(("flags", "fields", "free"), _CHANGES)
def test_the_cli_and_launch_agree_on_what_a_resume_may_change(
        tmp_path: Path, flags: list[str], fields: dict[str, Any], free: bool) -> None:
    from trainthrough.cli import _resume_config, build_parser
    from trainthrough.lab.resume import FREE_ON_RESUME
    from trainthrough.loop.launch import _as_recorded

    out = tmp_path / "cut"
    _cut(out)
    recorded = RunConfig.from_toml(out / "config.toml")
    assert free == all(k in FREE_ON_RESUME for k in fields)
    args = build_parser().parse_args(["run", "--out", str(out), "--resume", *flags])
    asked = RunConfig(**{**KW, **fields})  # launch() builds the whole config afresh
    if not free:
        key = next(iter(fields))
        with pytest.raises(UserError, match=f"is {getattr(recorded, key)!r}, not"):
            _resume_config(args)
        with pytest.raises(UserError, match=f"with {key} = {getattr(recorded, key)!r}, not"):
            _as_recorded(asked, out)
        return
    by_cli, _ = _resume_config(args)
    by_launch = _as_recorded(asked, out)
    for k, v in fields.items():
        assert getattr(by_cli, k) == getattr(by_launch, k) == v
    # Everything else is the recorded run's.
    rest = {k: v for k, v in recorded.to_dict().items() if k not in FREE_ON_RESUME}
    assert {k: by_cli.to_dict()[k] for k in rest} == rest
    assert {k: by_launch.to_dict()[k] for k in rest} == rest


def test_a_resume_refuses_another_checkpoint_folder(cli, tmp_path: Path) -> None:  # noqa: ANN001
    """The checkpoint is read from the recorded folder: another one is refused in one
    line (exit 2), never silently replaced by the recorded one."""
    from trainthrough.loop.launch import _as_recorded

    out = tmp_path / "cut"
    _cut(out)
    _one_line_error(cli("run", "--out", str(out), "--resume", "--checkpoint-dir",
                        str(tmp_path / "elsewhere"), "--quiet"), "--checkpoint-dir")
    with pytest.raises(UserError, match="checkpoint_dir"):
        _as_recorded(RunConfig(**KW, checkpoint_dir=str(tmp_path / "elsewhere")), out)
