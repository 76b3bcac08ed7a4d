"""A chain forward's frame as its receiver sees it, without a socket."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from trainthrough.engines.ray.chain import wire


def through_bytes(header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple:
    """A frame as the receiver sees it: JSON decoded, payload in one fresh buffer."""
    head, buffers = wire.describe(header, tensors)
    payload = np.frombuffer(b"".join(bytes(memoryview(b).cast("B")) for b in buffers),
                            np.uint8).copy()
    return wire.from_frame(json.loads(head), payload)
