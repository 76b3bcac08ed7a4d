"""Which sockets the processes of this test session listen on (read from /proc).

Used by the loopback tests and the chaos benchmark: every listener a run opens (Ray's
GCS, raylet, object store and workers; gloo's store and pairs; ZooKeeper) must be
bound to a loopback address unless the user named another one.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_LISTEN = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}


def _addr(hex_addr: str, v6: bool) -> str:
    ip_hex, port_hex = hex_addr.split(":")
    port = int(port_hex, 16)
    raw = bytes.fromhex(ip_hex)
    if not v6:
        return f"{'.'.join(str(b) for b in raw[::-1])}:{port}"
    # /proc stores IPv6 as four little-endian 32-bit words.
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
    full = b"".join(words)
    if full[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped
        return f"::ffff:{'.'.join(str(b) for b in full[12:])}:{port}"
    groups = [full[i:i + 2].hex() for i in range(0, 16, 2)]
    return f"[{':'.join(groups)}]:{port}"


def _descendants() -> set[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                text = (d / "stat").read_text()
            except OSError:
                continue
            parents[int(d.name)] = int(text[text.rfind(")") + 2:].split()[1])
    me, out = os.getpid(), set()
    for pid in parents:
        cur, seen = pid, 0
        while cur in parents and seen < 64:
            if cur == me:
                out.add(pid)
                break
            cur, seen = parents[cur], seen + 1
    return out


def listeners() -> dict[str, int]:
    """``address:port`` -> owning pid, for every listening socket of this process and
    its descendants (TCP LISTEN, unconnected UDP)."""
    inodes: dict[str, str] = {}
    for proto, state in _LISTEN.items():
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == state and (proto.startswith("tcp") or f[2].endswith(":0000")):
                inodes[f[9]] = f"{proto} {_addr(f[1], proto.endswith('6'))}"
    out: dict[str, int] = {}
    for pid in _descendants() | {os.getpid()}:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                out[inodes[link[8:-1]]] = pid
    return out


def is_loopback(entry: str) -> bool:
    addr = entry.split(" ", 1)[1]
    host = addr.rsplit(":", 1)[0]
    return (host.startswith("127.") or host.startswith("::ffff:127.")
            or host == "[0000:0000:0000:0000:0000:0000:0000:0001]")


def assert_loopback(seen: dict[str, int]) -> None:
    """Every listener in ``seen`` (from a :class:`Sampler`) is on loopback."""
    assert seen, "no listening socket was observed: the sampler is broken"
    outside = {s: pid for s, pid in seen.items() if not is_loopback(s)}
    assert not outside, f"listening beyond loopback: {outside}"


class Sampler:
    """Collects listeners every ``every`` seconds in a background thread."""

    def __init__(self, every: float = 0.25) -> None:
        self.every, self.seen = every, dict[str, int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.seen.update(listeners())
            time.sleep(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seen.update(listeners())
