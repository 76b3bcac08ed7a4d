"""What ``launch`` takes and refuses, before any process starts.

Your loop's own arguments (``options``, the parameters of ``train`` after ``loop``),
``allreduce_buckets``, and the run folder: each refusal is one line naming the argument
as the Python caller spelled it (the command line's messages name its flags).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.loops.exact_loop import train
from trainthrough.errors import UserError
from trainthrough.lab.run_folder import CLI, check_out
from trainthrough.loop import launch
from trainthrough.workloads import make_workload
from trainthrough.workloads.options import check_options, parse_option

REF = "tests.loops.exact_loop:train"


def _launch(tmp: Path, **kw: object) -> None:
    base: dict[str, object] = dict(ranks=2, engine="gloo", out=tmp / "run", progress=False)
    launch(train, **{**base, **kw})  # type: ignore[arg-type]


def test_the_loops_arguments_are_its_parameters_after_loop() -> None:
    check_options(REF, {"hidden": 8, "tag": "a"})
    assert parse_option(REF, "hidden", "8") == 8  # typed by the annotation (--option)
    assert make_workload(REF, hidden=8).name == REF
    with pytest.raises(UserError, match="has no option 'loop'.*hidden, tag"):
        check_options(REF, {"loop": 1})  # the handle is not an argument
    with pytest.raises(UserError, match="hidden"):
        check_options(REF, {"hidden": "wide"})


@pytest.mark.parametrize(("kw", "words"), [
    (dict(options={"width": 3}), "has no option 'width'; its options: hidden, tag"),
    (dict(options={"hidden": 2.5}), "workload option hidden"),
    (dict(fail="rank=1@iter=5,phase=allreduce:2", allreduce_buckets=2),
     "the allreduce has 2 buckets (allreduce_buckets), so K in allreduce:K goes from 0 to 1"),
    (dict(allreduce_buckets=0), "allreduce"),
])
def test_launch_refuses_before_anything_starts(kw: dict[str, object], words: str,
                                                tmp_path: Path) -> None:
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        _launch(tmp_path, **kw)
    assert not (tmp_path / "run").exists()  # no folder, no process


def test_a_refused_folder_is_named_as_the_caller_named_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="^out .*file is a file, not a folder; "
                                        "choose another out$"):
        _launch(tmp_path, out=tmp_path / "file")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="not a trainthrough run; choose another out$"):
        _launch(tmp_path, out=tmp_path / "theirs")
    with pytest.raises(UserError, match="^resume=True: .* holds no trainthrough run to "
                                        "continue; drop resume=True to start one$"):
        _launch(tmp_path, out=tmp_path / "theirs", resume=True, strategy="checkpoint-restart")
    # The command line's own words stay its flags.
    with pytest.raises(UserError, match="choose another --out$"):
        check_out(tmp_path / "theirs", names=CLI)
