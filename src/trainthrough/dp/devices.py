"""Where a replica computes and how its group reduces: the device and collective choices.

Two decisions, both pure functions of what was asked and what the host has, so they
are checked on any machine (a CUDA-less one included) and taken the same way by the
driver (which records them) and by every rank (which acts on them):

- :func:`resolve_device`: ``auto`` is ``cuda:<local rank mod GPUs>`` when CUDA is
  present and the CPU otherwise (torchrun's ``LOCAL_RANK`` convention); ``cpu`` forces
  the CPU; ``cuda`` / ``cuda:N`` are refused in one line where there is no such GPU.
- :func:`choose_collective`: NCCL when every rank of a host has a GPU of its own,
  gloo otherwise. Gloo runs on host memory: a CUDA replica's bucket is staged
  (device → host, reduced, host → device). NCCL cannot put two ranks of one
  communicator on one GPU, so ranks that share one always take gloo.

:func:`to_device` moves what a ``collate_fn`` returned onto the replica's device, as
``DistributedDataParallel`` moves a module's inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainthrough.config import DEVICE_NAME
from trainthrough.errors import UserError

DEVICE_FORMS = "auto, cpu, cuda or cuda:N"
COLLECTIVES = ("auto", "gloo", "nccl")


def check_device_name(name: str) -> None:
    """Refuse a device name that is none of :data:`DEVICE_FORMS` (any machine)."""
    if not DEVICE_NAME.fullmatch(name):
        raise UserError(f"--device {name!r}: use {DEVICE_FORMS}")


def cuda_count() -> int:
    """GPUs this process can use (0 without CUDA). Initializes the CUDA driver: not to
    be called in a process that forks ranks afterwards (the rank zygote)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(name: str, local_rank: int, gpus: int) -> torch.device:
    """The device of the replica of local rank ``local_rank`` on a host with ``gpus`` GPUs.

    Raises:
        UserError: a malformed name, or CUDA asked for where there is none (or not
            that many GPUs).
    """
    check_device_name(name)
    if name == "cpu" or (name == "auto" and gpus == 0):
        return torch.device("cpu")
    if gpus == 0:
        raise UserError(f"--device {name}: this machine has no CUDA device "
                        "(torch.cuda.is_available() is False); use --device cpu or auto")
    if name in ("auto", "cuda"):
        return torch.device("cuda", local_rank % gpus)
    index = int(name.partition(":")[2])
    if index >= gpus:
        raise UserError(f"--device {name}: this machine has {gpus} CUDA device"
                        f"{'s' * (gpus > 1)} (cuda:0 to cuda:{gpus - 1})")
    return torch.device("cuda", index)


@dataclass(frozen=True)
class CollectiveChoice:
    """The backend a group forms with and why (recorded in ``summary.json``)."""

    backend: str  # "gloo" or "nccl"
    staged: bool  # gloo on CUDA replicas: buckets go through host memory
    reason: str

    def record(self) -> dict[str, Any]:
        return {"backend": self.backend, "host_staging": self.staged, "reason": self.reason}


def choose_collective(asked: str, device: str, local_ranks: int, gpus: int,
                      nccl: bool | None = None) -> CollectiveChoice:
    """The collective for ``local_ranks`` ranks per host whose replicas live on
    ``device`` (``cpu`` or ``cuda``: the type), on hosts with ``gpus`` GPUs.

    Raises:
        UserError: ``asked`` is not in :data:`COLLECTIVES`, or is ``nccl`` where NCCL
            cannot run (CPU replicas, ranks sharing a GPU, a torch without NCCL).
    """
    if asked not in COLLECTIVES:
        raise UserError(f"--collective {asked!r}: use {', '.join(COLLECTIVES)}")
    have_nccl = dist.is_nccl_available() if nccl is None else nccl
    if device == "cpu":
        if asked == "nccl":
            raise UserError("--collective nccl reduces CUDA tensors: it needs --device cuda "
                            "(or auto on a machine with GPUs)")
        return CollectiveChoice("gloo", False, "replicas on the CPU")
    own_gpu = local_ranks <= gpus
    if asked == "nccl" and not have_nccl:
        raise UserError("--collective nccl: this torch build has no NCCL; use gloo or auto")
    if asked == "nccl" and not own_gpu:
        raise UserError(f"--collective nccl needs a GPU per rank: {local_ranks} ranks share "
                        f"{gpus} GPU{'s' * (gpus > 1)} on a host; use --collective gloo "
                        "(or auto), or fewer ranks per host")
    if asked in ("auto", "nccl") and own_gpu and have_nccl:
        return CollectiveChoice("nccl", False, "one GPU per rank" if asked == "auto"
                                else "asked for")
    why = ("asked for" if asked == "gloo" else
           "NCCL missing from this torch" if not have_nccl else
           f"{local_ranks} ranks share {gpus} GPU{'s' * (gpus > 1)}")
    return CollectiveChoice("gloo", True, why)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (nested in tuples, lists and mappings) on
    ``device``; other values as they are. Pinned host tensors are copied without
    blocking the host."""
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=batch.is_pinned() if device.type == "cuda"
                        else False)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(x, device) for x in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(x, device) for x in batch)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


@dataclass(frozen=True)
class DevicePlan:
    """A run's device kind (``cpu`` or ``cuda``) and collective, decided by the driver."""

    device: str
    collective: CollectiveChoice
    #: The share of a GPU each rank asks a scheduler for (Ray's ``num_gpus``): 0 on the
    #: CPU, 1 with a GPU per rank, 1/k when k ranks share one.
    gpus_per_rank: float = 0.0

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps of it."""
        return {"device": self.device, "collective": self.collective.record()}


def plan_devices(device: str, collective: str, own_loop: bool, ranks: int,
                 gpus: int, nccl: bool | None = None) -> DevicePlan:
    """The device kind and collective of a data-parallel run of ``ranks`` ranks on one
    host with ``gpus`` GPUs (a cluster: per host, at most ``ranks``).

    Raises:
        UserError: a device or collective this host cannot give, or ``--device cuda``
            with a trainthrough workload (they compute on the CPU; a device applies to
            your own loop).
    """
    check_device_name(device)
    if not own_loop and device not in ("auto", "cpu"):
        raise UserError(f"--device {device}: trainthrough's own workloads compute on the CPU; "
                        "a device applies to your own loop (its model on that device); "
                        "drop --device or use cpu")
    kind = resolve_device(device, 0, gpus).type if own_loop else "cpu"
    share = 0.0 if kind == "cpu" else 1.0 / -(-ranks // gpus)  # ceil(ranks / gpus) per GPU
    return DevicePlan(kind, choose_collective(collective, kind, ranks, gpus, nccl), share)
