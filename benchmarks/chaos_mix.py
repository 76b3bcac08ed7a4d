"""The gloo soak's fault mix: what strikes when, SIGTERMs from outside, and the tally.

:func:`plan` lays ``n`` faults over a window, one every ``window / n`` seconds with a
seeded jitter inside each slice (so two faults never pile up by chance and the count
delivered is the count planned), each of a kind drawn in proportion to its weight. All
but one kind are failure specs the run injects itself (``rank=any@time=T,mode=M``); the
``sigterm`` kind is a preemption from outside, as a cloud sends it: :class:`Outside`,
a thread of this script, SIGTERMs one of the run's live rank processes at its time and
SIGKILLs it if it is still there when the notice runs out. It also watches the run's
processes for one left stopped (SIGSTOP, a pause or a hang) longer than the liveness
timeout plus a margin: the run must end those, not keep them.

:func:`tally` reads the run's events back into a row per kind: injected, then what
answered each fault (drained at a step boundary, fenced, recovered by the group, went
on unnoticed, killed at the end of its notice), and the faults nothing answered.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainthrough.engines.signals import Pinned, pin


@dataclass(frozen=True)
class Kind:
    """A kind of fault: its table row, the spec's ``mode=`` (None: a SIGTERM sent from
    outside by :class:`Outside`), and its share of the mix."""

    name: str
    mode: str | None
    weight: int


#: The gloo soak's kinds. The pauses are sized against :data:`TIMEOUTS`: 300 ms is
#: shorter than every wait (it goes unnoticed), 4 s outlasts the collective timeout (the
#: group fences the rank and goes on; it wakes, finds itself out, leaves), 9 s outlasts
#: the liveness timeout too (the controller ends it).
GLOO_KINDS = (Kind("crash", "crash", 3), Kind("hang", "hang", 1),
              Kind("pause-300ms", "pause:300ms", 1), Kind("pause-4s", "pause:4s", 2),
              Kind("pause-9s", "pause:9s", 1), Kind("preempt-5s", "preempt:5s", 2),
              Kind("sigterm-5s", None, 2), Kind("slow-4x", "slow:4x", 1))
#: The collective timeout and the liveness timeout of the gloo soak (seconds).
TIMEOUTS = {"collective": 2.0, "liveness": 6.0}
#: How long a SIGTERM from outside gives the rank before its SIGKILL.
OUTSIDE_NOTICE = 5.0
#: A process of the run stopped longer than the liveness timeout plus this is left behind.
STOPPED_MARGIN = 10.0
OUTCOMES = ("drained", "fenced", "recovered", "went on", "killed at notice end",
            "unanswered")


@dataclass(frozen=True)
class Fault:
    at: float  #: seconds from the run's start
    kind: Kind

    def spec(self) -> str | None:
        """The failure spec that injects it (None: sent from outside)."""
        if self.kind.mode is None:
            return None
        mode = "" if self.kind.mode == "crash" else f",mode={self.kind.mode}"
        return f"rank=any@time={self.at:.2f}s{mode}"


def plan(n: int, start: float, window: float, kinds: tuple[Kind, ...],
         seed: int) -> list[Fault]:
    """``n`` faults in ``[start, start + window)``, one per slice, kinds by weight
    (largest remainder, so every kind with a weight gets its share), order seeded."""
    rng = random.Random(seed)
    total = sum(k.weight for k in kinds)
    counts = {k: n * k.weight // total for k in kinds}
    by_rest = sorted(kinds, key=lambda k: -(n * k.weight % total))
    for k in by_rest[:n - sum(counts.values())]:
        counts[k] += 1
    order = [k for k in kinds for _ in range(counts[k])]
    rng.shuffle(order)
    step = window / n
    return [Fault(round(start + (i + rng.uniform(0.1, 0.9)) * step, 2), k)
            for i, k in enumerate(order)]


@dataclass
class Sent:
    """One SIGTERM from outside: to whom, when, and how the process ended."""

    pid: int
    at: float
    handle: Pinned | None  #: None only where no signal is sent (a tally's test)
    ended: str = ""  #: "" while it runs, "left" within the notice, "killed" after it


@dataclass(eq=False)  # a thread: hashed by identity
class Outside(threading.Thread):
    """Sends the plan's outside SIGTERMs to the run's rank processes and watches for
    processes left stopped. ``ranks()`` lists the pids of the run's live rank
    processes; ``stopped()`` those of its processes stopped now."""

    times: list[float]
    ranks: Callable[[], list[int]]
    stopped: Callable[[], list[int]]
    seed: int = 0
    sent: list[Sent] = field(default_factory=list)
    missed: int = 0  #: SIGTERMs due while the run had no rank process to send to
    stopped_longest: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)
        self._halt = threading.Event()
        self._rng = random.Random(self.seed)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10.0)
        for s in self.sent:
            if s.handle is not None:
                s.handle.close()

    def run(self) -> None:
        t0 = time.monotonic()
        due = sorted(self.times)
        since: dict[int, float] = {}
        while not self._halt.wait(0.25):
            now = time.monotonic() - t0
            while due and due[0] <= now:
                due.pop(0)
                self._send(now)
            for s in self.sent:
                if s.ended:
                    continue
                if not s.handle.alive():
                    s.ended = "left"
                elif now - s.at >= OUTSIDE_NOTICE:
                    s.handle.send(signal.SIGKILL)  # the machine goes: the cloud's reclaim
                    s.ended = "killed"
            still = set(self.stopped())
            for pid in list(since):
                if pid not in still:
                    del since[pid]
            for pid in still:
                since.setdefault(pid, now)
                self.stopped_longest[pid] = max(self.stopped_longest.get(pid, 0.0),
                                                now - since[pid])

    def _send(self, now: float) -> None:
        taken = {s.pid for s in self.sent if not s.ended}
        pids = [p for p in self.ranks() if p not in taken]
        self._rng.shuffle(pids)
        for pid in pids:
            # Pinned first, then checked to be a rank of this run: the signal reaches
            # that very process or none (signals.py).
            handle = pin(pid)
            if handle is None or pid not in self.ranks():
                if handle is not None:
                    handle.close()
                continue
            if handle.send(signal.SIGTERM):
                self.sent.append(Sent(pid, now, handle))
                return
            handle.close()
        self.missed += 1


def tally(events: list[dict[str, Any]], faults: list[Fault],
          sent: list[Sent]) -> dict[str, dict[str, int]]:
    """A row per kind: ``injected`` (delivered: a ``failure`` event, or a SIGTERM sent),
    then how many of those each outcome answered (:data:`OUTCOMES`; a fault fenced and
    then recovered counts in both).

    Each fault stays open on its slot until an event about that slot answers it: a
    ``drained`` (its notice honoured at a step boundary), a ``detection`` (the group
    recovered without it), a ``pause-ended`` still a member (a pause nobody noticed).
    ``rank-fenced`` and ``preempt-expired`` mark it and leave it open for the recovery
    that follows. A slow rank the group simply waited for is ``went on``. A SIGTERM
    from outside that struck a process already fenced out (by an earlier hang or
    pause) is ``fenced``: it had no group left to drain from; one that struck a rank
    draining on an injected notice is ``drained`` if it left in time."""
    kind_of = {f.spec(): f.kind.name for f in faults if f.spec()}
    outside = next((f.kind.name for f in faults if f.kind.mode is None), "sigterm")
    by_pid = {s.pid: s for s in sent}
    sent_pids = set(by_pid)
    rows: dict[str, dict[str, int]] = {}
    open_: dict[int, list[tuple[str, set[str]]]] = {}
    stopped_pid: dict[int, int] = {}  # slot -> the pid a hang or pause stopped last
    fenced_pids: set[int] = set()  # processes the group fenced out
    # Processes with an injected notice already: a second SIGTERM changes nothing.
    noticed = {e["pid"] for e in events
               if e.get("type") == "preempt-notice" and e.get("source") == "injected"}

    def row(name: str) -> dict[str, int]:
        return rows.setdefault(name, {"injected": 0, **{o: 0 for o in OUTCOMES}})

    def close(slot: int, outcome: str, only: Callable[[str], bool] = lambda _: True) -> None:
        keep = []
        for name, marks in open_.get(slot, []):
            if only(name):
                row(name)[outcome] += 1
                for m in marks:
                    row(name)[m] += 1
            else:
                keep.append((name, marks))
        open_[slot] = keep

    def mark(slot: int, outcome: str) -> None:
        for _, marks in open_.get(slot, []):
            marks.add(outcome)

    for e in events:
        t = e.get("type")
        if t == "failure" and e.get("spec") in kind_of:
            name = kind_of[e["spec"]]
            row(name)["injected"] += 1
            slot = e["ids"][0]
            # A slow rank struck again is answered: the group ran at its pace.
            close(slot, "went on", lambda n: n.startswith("slow"))
            open_.setdefault(slot, []).append((name, set()))
            if e.get("mode") in ("hang", "pause") and "pid" in e:
                stopped_pid[slot] = e["pid"]
        elif t == "preempt-notice" and e.get("source") == "signal" and e["pid"] in sent_pids:
            # Killed when its notice ran out, by this script (not the run's own expiry).
            marks = {"killed at notice end"} if by_pid[e["pid"]].ended == "killed" else set()
            close(e["slot"], "went on", lambda n: n.startswith("slow"))
            open_.setdefault(e["slot"], []).append((outside, marks))
            sent_pids.discard(e["pid"])
        elif t == "drained":
            for s in e["slots"]:
                close(s, "drained")
        elif t == "detection":
            for name in e.get("failed") or []:
                if name.startswith("rank"):
                    close(int(name[4:]), "recovered")
        elif t == "rank-fenced":
            mark(e["slot"], "fenced")
            if e["slot"] in stopped_pid:
                fenced_pids.add(stopped_pid.pop(e["slot"]))
        elif t == "preempt-expired":
            mark(e["slot"], "killed at notice end")
        elif t == "pause-ended" and e.get("member"):
            close(e["slot"], "went on", lambda n: n.startswith("pause"))
    for s in sent:
        row(outside)["injected"] += 1
        if s.pid in sent_pids:  # no notice event: it never took the SIGTERM as one
            # A process the group had fenced out already (a hang, a pause past the
            # timeout): its notice, if it woke to send one, was refused.
            out = "fenced" if s.pid in fenced_pids else \
                "killed at notice end" if s.ended == "killed" else \
                "drained" if s.pid in noticed and s.ended == "left" else "unanswered"
            row(outside)[out] += 1
    for slot in list(open_):
        close(slot, "went on", lambda n: n.startswith("slow"))
        close(slot, "unanswered")
    return rows


def table(rows: dict[str, dict[str, int]]) -> str:
    """The tally as a Markdown table, kinds in the mix's order, a total last."""
    cols = ["injected", *OUTCOMES]
    names = [k.name for k in GLOO_KINDS if k.name in rows] + \
        [n for n in rows if n not in {k.name for k in GLOO_KINDS}]
    lines = ["| kind | " + " | ".join(cols) + " |", "| --- " * (len(cols) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(str(rows[n][c]) for c in cols) + " |")
    lines.append("| total | " + " | ".join(str(sum(r[c] for r in rows.values()))
                                          for c in cols) + " |")
    return "\n".join(lines)



def wipes(events: list[dict[str, Any]], ranks: int) -> tuple[int, int]:
    """Restarts after every rank was lost at once: a ``detection`` with no survivor,
    then ``restored``. Under rollback, which keeps no checkpoint, the group starts
    again from the ``restored`` step, and the steps committed since are gone by design
    (N ranks outlive N - 1 overlapping losses, not N), as chain-sync's wiped chains.

    Returns:
        How many, and the updates they took: each wipe's committed steps (the
        ``logical`` of the last failure before it) past the restored step, times
        ``ranks``, which is how the run's summary counts ``updates_lost``.
    """
    count = lost = logical = 0
    empty = False
    for e in events:
        t = e.get("type")
        if t == "failure" and not empty:
            logical = e.get("logical", logical)
        elif t == "detection":
            empty = e.get("survivors") == []
        elif t == "restored" and empty:
            count, lost, empty = count + 1, lost + (logical - e["step"]) * ranks, False
    return count, lost
