"""A safetensors file's tensors as views of its bytes (ft/checkpoint/views.py)."""

from __future__ import annotations

import io
import json
import struct

import pytest
import safetensors.torch
import torch

from trainthrough.ft.checkpoint.views import read_into, tensors_of


def test_views_hold_what_safetensors_reads_without_a_copy() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=g), "b": torch.arange(5),
               "c": torch.tensor(True), "d": torch.randn(2, generator=g).to(torch.bfloat16),
               "e": torch.zeros(0, 3), "f": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    raw = safetensors.torch.save(tensors, metadata={"k": "v"})
    buf = read_into(io.BytesIO(raw), len(raw))
    assert bytes(buf) == raw  # exactly the file (one byte more would be read if longer)
    out = tensors_of(buf)
    ref = safetensors.torch.load(raw)
    assert out.keys() == ref.keys()
    assert all(out[k].dtype == ref[k].dtype and torch.equal(out[k], ref[k]) for k in ref)
    # The tensors are the buffer: writing one writes the file's bytes.
    before = bytes(buf)
    out["a"][0, 0] = 123.0
    assert bytes(buf) != before


@pytest.mark.parametrize("why, header, data", [
    ("past the end", None, b""),
    ("not JSON", b"{nope", b""),
    ("hole", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    ("overlap", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                 "y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("do not hold", {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("unknown dtype", {"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("after its last", {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0" * 3),
])
def test_a_malformed_file_is_refused_naming_why(why: str, header: object, data: bytes) -> None:
    if header is None:
        raw = struct.pack("<Q", 1000) + b"{}"
    else:
        text = header if isinstance(header, bytes) else json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + data
    with pytest.raises(ValueError, match=why):
        tensors_of(bytearray(raw))


def test_a_restored_state_saves_again_as_it_is(tmp_path) -> None:  # noqa: ANN001
    """Tensors restored as views of one file's bytes save again and read back equal."""
    from trainthrough.ft.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path), keep_last=2)
    store.save(1, {"optim/a": torch.arange(6.0), "optim/b": torch.ones(2, 3)})
    back, _ = store.load(1)
    store.save(2, back)
    again, _ = store.load(2)
    assert torch.equal(again["optim/a"], torch.arange(6.0))
    assert torch.equal(again["optim/b"], torch.ones(2, 3))
