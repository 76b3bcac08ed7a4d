"""Device and collective choices (dp/devices.py), checked without a GPU: every
decision is a function of what was asked and what the host has, so a host with 0, 1
or 8 GPUs is a number here. What only a GPU can show is benchmarks/gpu_check.py's."""

from __future__ import annotations

import time
from collections import namedtuple

import pytest
import torch
from torch import nn

from trainthrough import cli
from trainthrough.dp.devices import (
    choose_collective,
    plan_devices,
    resolve_device,
    to_device,
)
from trainthrough.dp.module_replica import ModuleReplica
from trainthrough.engines.gloo.group import wait_or_abort
from trainthrough.errors import UserError
from trainthrough.ft.host_snapshot import HostSnapshot


@pytest.mark.parametrize(("name", "local", "gpus", "want"), [
    ("auto", 0, 0, "cpu"), ("auto", 3, 2, "cuda:1"), ("cpu", 1, 8, "cpu"),
    ("cuda", 5, 4, "cuda:1"), ("cuda:2", 0, 4, "cuda:2")])
def test_device_resolution(name: str, local: int, gpus: int, want: str) -> None:
    assert resolve_device(name, local, gpus) == torch.device(want)


@pytest.mark.parametrize(("name", "gpus", "says"), [
    ("cuda", 0, "no CUDA device"), ("cuda:0", 0, "no CUDA device"),
    ("cuda:2", 2, "cuda:0 to cuda:1"), ("gpu", 1, "auto, cpu, cuda or cuda:N"),
    ("cuda:x", 1, "auto, cpu, cuda or cuda:N")])
def test_device_refusals(name: str, gpus: int, says: str) -> None:
    with pytest.raises(UserError, match=says):
        resolve_device(name, 0, gpus)


@pytest.mark.parametrize(("asked", "device", "ranks", "gpus", "nccl", "backend", "staged"), [
    ("auto", "cpu", 4, 0, True, "gloo", False),
    ("auto", "cuda", 4, 8, True, "nccl", False),   # a GPU per rank
    ("auto", "cuda", 4, 1, True, "gloo", True),    # ranks share a GPU: staged through host
    ("auto", "cuda", 2, 2, False, "gloo", True),   # no NCCL in this torch
    ("gloo", "cuda", 2, 2, True, "gloo", True),    # asked for
    ("nccl", "cuda", 2, 2, True, "nccl", False)])
def test_collective_choice(asked: str, device: str, ranks: int, gpus: int, nccl: bool,
                           backend: str, staged: bool) -> None:
    c = choose_collective(asked, device, ranks, gpus, nccl)
    assert (c.backend, c.staged) == (backend, staged)
    assert c.record()["backend"] == backend and c.reason


@pytest.mark.parametrize(("asked", "device", "ranks", "gpus", "nccl", "says"), [
    ("nccl", "cpu", 2, 0, True, "needs --device cuda"),
    ("nccl", "cuda", 4, 1, True, "a GPU per rank: 4 ranks share 1 GPU"),
    ("nccl", "cuda", 2, 2, False, "no NCCL"),
    ("mpi", "cpu", 2, 0, True, "auto, gloo, nccl")])
def test_collective_refusals(asked: str, device: str, ranks: int, gpus: int, nccl: bool,
                             says: str) -> None:
    with pytest.raises(UserError, match=says):
        choose_collective(asked, device, ranks, gpus, nccl)


def test_builtin_workloads_refuse_a_gpu_but_auto_keeps_the_cpu() -> None:
    with pytest.raises(UserError, match="own workloads compute on the CPU"):
        plan_devices("cuda", "auto", own_loop=False, ranks=2, gpus=2)
    p = plan_devices("auto", "auto", own_loop=False, ranks=2, gpus=2, nccl=True)
    assert p.record() == {"device": "cpu", "collective": {
        "backend": "gloo", "host_staging": False, "reason": "replicas on the CPU"}}
    loop = plan_devices("auto", "auto", own_loop=True, ranks=2, gpus=2, nccl=True)
    assert (loop.device, loop.collective.backend) == ("cuda", "nccl")


def test_cli_refuses_cuda_without_cuda_in_one_line(capsys: pytest.CaptureFixture[str],
                                                   tmp_path) -> None:  # noqa: ANN001
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = cli.main(["run", "--paradigm", "dp", "--engine", "gloo", "--workload",
                     "examples/byo_loop.py:train", "--device", "cuda",
                     "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no CUDA device" in err[0], err
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_batches_move_to_the_device_whatever_their_nesting() -> None:
    Pair = namedtuple("Pair", "x y")
    x, y = torch.ones(2), torch.zeros(2, dtype=torch.long)
    batch = {"a": [x, (y, "label")], "b": Pair(x, 3)}
    out = to_device(batch, torch.device("meta"))  # a second device every machine has
    assert out["a"][0].device.type == "meta" and out["a"][1][0].device.type == "meta"
    assert out["a"][1][1] == "label" and isinstance(out["b"], Pair) and out["b"].y == 3
    assert to_device(x, torch.device("cpu")) is x  # already there: not copied


def test_a_replica_lives_on_one_device() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    replica = ModuleReplica(0, model, torch.optim.SGD(model.parameters(), lr=0.1),
                            lambda rows: rows, 0)
    assert replica.device == torch.device("cpu")
    model[1].to("meta")
    with pytest.raises(UserError, match="several devices"):
        ModuleReplica(0, model, torch.optim.SGD(model.parameters(), lr=0.1),
                      lambda rows: rows, 0)


class _Work:
    def __init__(self, done_after: float) -> None:
        self.at = time.monotonic() + done_after

    def is_completed(self) -> bool:
        return time.monotonic() >= self.at

    def wait(self) -> None:
        return None


def test_a_stalled_collective_is_aborted_at_the_timeout() -> None:
    aborted: list[bool] = []
    wait_or_abort(_Work(0.01), 2.0, lambda: aborted.append(True))
    assert aborted == []
    t = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out after 0.1 s"):
        wait_or_abort(_Work(60.0), 0.1, lambda: aborted.append(True))
    assert aborted == [True] and time.monotonic() - t < 1.0


def test_a_cpu_snapshot_is_the_state_itself() -> None:
    state = {"params/w": torch.arange(4.0)}
    snap = HostSnapshot().take(state)
    assert snap.ready is None and snap.tensors()["params/w"] is state["params/w"]


def test_gpu_check_refuses_bad_arguments_and_a_missing_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    assert gpu_check.main(["--ranks", "5"]) == 2
    if not torch.cuda.is_available():
        assert gpu_check.main([]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(("ranks", "gpus", "share"), [(4, 8, 1.0), (4, 1, 0.25), (3, 2, 0.5)])
def test_a_rank_asks_for_its_share_of_a_gpu(ranks: int, gpus: int, share: float) -> None:
    assert plan_devices("cuda", "auto", True, ranks, gpus, nccl=True).gpus_per_rank == share
    assert plan_devices("cpu", "auto", True, ranks, gpus).gpus_per_rank == 0.0
