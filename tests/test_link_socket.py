"""A chain link's socket: frames (never pickle), the token, refusals, loopback."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from tests.frames import through_bytes
from trainthrough.engines.ray.chain import wire
from trainthrough.engines.ray.chain.link_socket import Channel, LinkError, Listener


def test_pushes_and_a_state_come_back_bit_identical_with_every_dtype() -> None:
    g = torch.Generator().manual_seed(0)
    items = [(3, 7, {"w": torch.randn(4, 5, generator=g), "b": torch.randn(3, generator=g)}, 0.5),
             (1, 2, {"w": torch.randn(4, 5, generator=g).half()}, 1.0),
             (2, 9, {}, 1.0)]  # an empty push still takes a position
    op, gen, pos, back = through_bytes(*wire.frame_items(4, 11, items))
    assert (op, gen, pos) == ("push", 4, 11) and len(back) == 3
    for (w, s, u, sc), (w2, s2, u2, sc2) in zip(items, back):
        assert (w, s, sc) == (w2, s2, sc2) and u.keys() == u2.keys()
        assert all(u2[k].dtype == v.dtype and torch.equal(u2[k], v) for k, v in u.items())
    state = {"value/w": torch.randn(4, 5, generator=g), "opt/w.m": torch.randn(1, generator=g),
             "version": torch.tensor([5]), "applied": torch.tensor([[0, 3], [1, 4]]),
             "x": torch.tensor(2.5, dtype=torch.bfloat16), "e": torch.zeros(0, 3)}
    op, gen, pos, back = through_bytes(*wire.frame_state(2, 40, state))
    assert (op, gen, pos) == ("state", 2, 40) and back.keys() == state.keys()
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_a_frame_of_another_dtype_is_not_framable_and_bad_layouts_are_refused() -> None:
    assert not wire.framable([torch.zeros(2, dtype=torch.complex64)])
    head = {"op": "push", "gen": 0, "pos": 1, "items": [[0, 1, 1.0, ["w"]]],
            "tensors": [["float32", [4], 0]]}
    with pytest.raises(ValueError):  # announces more bytes than came
        wire.from_frame(head, np.zeros(8, np.uint8))
    with pytest.raises(KeyError):  # a dtype a frame never carries (nothing is evaluated)
        wire.from_frame({**head, "tensors": [["object", [1], 0]]}, np.zeros(8, np.uint8))
    with pytest.raises(ValueError):
        wire.from_frame({**head, "op": "exec"}, np.zeros(16, np.uint8))


def _serve_log() -> tuple[list, Any]:
    got: list = []

    def serve(header: dict[str, Any], payload: np.ndarray) -> None:
        op, gen, pos, what = wire.from_frame(header, payload)
        if pos < 0:
            raise RuntimeError("position before the chain began")
        got.append((op, gen, pos, what))

    return got, serve


def test_forwards_are_served_in_order_and_a_refusal_comes_back_as_its_message() -> None:
    got, serve = _serve_log()
    listener = Listener("127.0.0.1", serve)
    try:
        assert listener.address[0] == "127.0.0.1"
        chan = Channel(listener.address, timeout=10)
        for first in (1, 2, 3):
            chan.send(*wire.describe(*wire.frame_items(1, first, [(0, first, {
                "w": torch.full((2, 2), float(first))}, 1.0)])))
            chan.reply()
        assert [g[2] for g in got] == [1, 2, 3]
        assert torch.equal(got[2][3][0][2]["w"], torch.full((2, 2), 3.0))
        chan.send(*wire.describe(*wire.frame_items(1, -1, [])))
        with pytest.raises(LinkError, match="before the chain began"):
            chan.reply()
        chan.send(*wire.describe(*wire.frame_items(1, 4, [])))  # the connection goes on
        chan.reply()
        assert got[-1][2] == 4
        chan.close()
    finally:
        listener.close()


def test_a_connection_without_the_token_is_dropped_unserved() -> None:
    got, serve = _serve_log()
    listener = Listener("127.0.0.1", serve)
    try:
        host, port, token = listener.address
        wrong = bytes(b ^ 1 for b in token)
        chan = Channel((host, port, wrong), timeout=5)
        chan.send(*wire.describe(*wire.frame_items(1, 1, [])))
        with pytest.raises(LinkError):
            chan.reply()
        time.sleep(0.05)
        assert got == []
    finally:
        listener.close()


def test_a_listener_never_binds_to_every_interface() -> None:
    for host in ("0.0.0.0", "", "::"):
        with pytest.raises(ValueError):
            Listener(host, lambda h, p: None)


def test_close_wakes_a_thread_waiting_for_a_reply() -> None:
    release = threading.Event()
    listener = Listener("127.0.0.1", lambda h, p: release.wait(10))
    try:
        chan = Channel(listener.address, timeout=30)
        chan.send(*wire.describe(*wire.frame_items(1, 1, [])))
        errors: list[Exception] = []

        def wait() -> None:
            try:
                chan.reply()
            except LinkError as e:
                errors.append(e)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.05)
        chan.close()
        t.join(5)
        assert not t.is_alive() and len(errors) == 1
    finally:
        release.set()
        listener.close()

