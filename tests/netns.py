"""Two "hosts" on one machine: two network namespaces joined by a veth pair (root only).

Used by the two-host test (tests/loops/two_hosts.py) and the distance benchmark
(benchmarks/distance.py). Each namespace has loopback and one end of the pair,
``10.254.0.1/30`` in ``a`` and ``10.254.0.2/30`` in ``b``, and no other interface or
route: nothing started in them can reach anything but the other end of the pair.
Names carry this process's pid, so two runs never share one; :meth:`Hosts.close`
deletes what :meth:`Hosts.create` made, by those names, after SIGKILLing every process
still inside (only processes started in these namespaces can be there).

Listeners are read from ``/proc/<pid>/net/tcp`` of a process inside each namespace (the
file shows the namespace of the process it belongs to), with the owning pid from its
file descriptors.

A partition (:meth:`Hosts.partition`) cuts the pair without a sign: every packet either
end sends is dropped by a ``pfifo`` queue of length 0 on it (this kernel has no
``netem`` and no ``tc`` drop action, and no iptables), so both sides stay up, their
connections stay open, and nothing reaches the other side until the queues are removed;
a connection the cut did not outlast goes on from where it was, as after a real one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ADDRESSES = ("10.254.0.1", "10.254.0.2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def why_not() -> str | None:
    """None if namespaces and veth pairs can be made here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth)"
    probe = f"ttprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "delete", probe)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot make a network namespace: {e}"
    return None


class Hosts:
    """Namespaces ``a`` and ``b`` (their names in :attr:`ns`) and the pair between them."""

    def __init__(self, tag: str | None = None) -> None:
        """``tag``: the names' prefix (default ``tt<pid>``; another process names the
        same pair by passing the creator's :attr:`tag`)."""
        self.tag = tag = tag or f"tt{os.getpid()}"
        self.ns = {"a": f"{tag}a", "b": f"{tag}b"}
        self.veth = {"a": f"{tag}va", "b": f"{tag}vb"}
        self.ip = dict(zip("ab", ADDRESSES, strict=True))

    def create(self) -> Hosts:
        try:
            for side in "ab":
                _ip("netns", "add", self.ns[side])
                _ip("-n", self.ns[side], "link", "set", "lo", "up")
            _ip("link", "add", self.veth["a"], "netns", self.ns["a"], "type", "veth",
                "peer", "name", self.veth["b"], "netns", self.ns["b"])
            for side in "ab":
                _ip("-n", self.ns[side], "addr", "add", f"{self.ip[side]}/30", "dev",
                    self.veth[side])
                _ip("-n", self.ns[side], "link", "set", self.veth[side], "up")
        except BaseException:
            self.close()
            raise
        return self

    def cmd(self, side: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``side``."""
        return ["ip", "netns", "exec", self.ns[side], *argv]

    def pids(self, side: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns[side]], capture_output=True,
                             text=True, timeout=30)
        return [int(x) for x in out.stdout.split()]

    def kill_all(self, side: str) -> int:
        """SIGKILL every process of namespace ``side`` at once (a host lost); how many."""
        pids = self.pids(side)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def limit(self, rate: str | None) -> None:
        """A token-bucket bandwidth limit (``1gbit``, ``100mbit``) on both ends of the
        pair, or none."""
        for side in "ab":
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip_tc(self.ns[side], "qdisc", "del", "dev", self.veth[side], "root")
            if rate:
                # burst: at least rate/HZ; 1 Mbit covers 1 Gbit/s at HZ=250 (tc's advice).
                _ip_tc(self.ns[side], "qdisc", "add", "dev", self.veth[side], "root", "tbf",
                       "rate", rate, "burst", "1mbit", "latency", "50ms")

    def cut(self) -> None:
        """Drop every packet either end of the pair sends, from now on (a silent cut)."""
        for side in "ab":
            _ip_tc(self.ns[side], "qdisc", "replace", "dev", self.veth[side], "root", "pfifo",
                   "limit", "0")

    def heal(self) -> None:
        """Undo :meth:`cut` (and any :meth:`limit`): both ends send again."""
        for side in "ab":
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip_tc(self.ns[side], "qdisc", "del", "dev", self.veth[side], "root")

    def is_cut(self) -> bool:
        """Whether either end of the pair drops what it sends."""
        return any("pfifo" in _tc_show(self.ns[side], self.veth[side]) for side in "ab")

    @contextlib.contextmanager
    def partition(self, seconds: float | None = None) -> Iterator[None]:
        """The pair cut while the block runs (and, with ``seconds``, at least that long
        from the cut), then healed, whatever ends the block: an error or a failed
        assertion inside it included."""
        start = time.monotonic()
        try:
            self.cut()
            yield
            if seconds is not None:
                time.sleep(max(0.0, seconds - (time.monotonic() - start)))
        finally:
            self.heal()

    def listeners(self, side: str) -> dict[str, tuple[int, str]]:
        """``address:port`` -> (pid, command) for every TCP listener in namespace ``side``."""
        pids = self.pids(side)
        if not pids:
            return {}
        inodes: dict[str, str] = {}
        for proto in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pids[0]}/net/{proto}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] == "0A":
                    inodes[f[9]] = _addr(f[1], proto == "tcp6")
        out: dict[str, tuple[int, str]] = {}
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        out[inodes[link[8:-1]]] = (pid, comm)
        return out

    def close(self) -> None:
        """SIGKILL what is left inside, then delete both namespaces (the pair goes with
        them). Only names this object made are touched."""
        for side in "ab":
            with contextlib.suppress(Exception):
                self.kill_all(side)
        time.sleep(0.2)
        for side in "ab":
            with contextlib.suppress(Exception):
                _ip("netns", "delete", self.ns[side])


def _ip_tc(ns: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True, capture_output=True,
                   timeout=30)


def _tc_show(ns: str, dev: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
                          capture_output=True, text=True, timeout=30).stdout


def _addr(hex_addr: str, v6: bool) -> str:
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if not v6:
        return f"{'.'.join(str(b) for b in raw[::-1])}:{int(port_hex, 16)}"
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return f"[{words.hex(':', 2)}]:{int(port_hex, 16)}"
