"""engines/signals.py's record of injected deaths, which a runtime's own thread reads."""

from __future__ import annotations

import threading
import time

from trainthrough.engines.signals import injected, note_injected


def test_a_death_noted_while_a_reader_waits_wakes_it_and_an_unknown_one_times_out() -> None:
    pid = 2**22 + 12345  # above the kernel's default pid_max: no process of this run
    assert not injected(pid)
    t0 = time.monotonic()
    assert not injected(pid, within=0.2)
    assert time.monotonic() - t0 >= 0.2
    threading.Timer(0.1, note_injected, (pid,)).start()
    t0 = time.monotonic()
    assert injected(pid, within=5.0)
    assert time.monotonic() - t0 < 4.0  # woken by the note, not by the timeout
