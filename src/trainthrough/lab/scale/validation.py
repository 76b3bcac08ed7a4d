"""The model next to published figures: effective training time and downtime per failure.

For each report, the model runs with the parameters the report gives (job size,
failure rate, duration, storage; :attr:`Published.given`) and the suite's defaults for
the rest (:attr:`Published.assumed` names each), with the variant of checkpoint-restart
closest to the report's mechanism. docs/scale-suite.md cites each source and holds the
table this module computed.

What the table shows beside the difference: for an effective-training-time figure,
the downtime per failure the model would have to add for the job to take the time the
report implies (what the measured costs here leave out at that size); for a downtime
figure, the ratio of the published downtime to the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainthrough.lab.scale.model import Outcome, mean_goodput, simulate
from trainthrough.lab.scale.params import ScaleParams, parse
from trainthrough.lab.scale.variants import BY_NAME, Variant

DAY = 86_400.0
#: the margins the table is held to: effective training time within 5 points;
#: downtime within a factor of 2
ETTR_MARGIN = 0.05
DOWNTIME_FACTOR = 2.0
#: checkpoints in a peer's memory and a warm spare to replace a failed accelerator:
#: ByteRobust's mechanism (no variant of the suite combines both)
MEMORY_WARM = Variant("checkpoint-restart/in-memory+warm", "checkpoint-restart",
                      interval="young-daly", store="memory", warm=True)


@dataclass(frozen=True)
class Published:
    """One published point and how the model is set up to meet it."""

    name: str
    source: str  #: citation (docs/scale-suite.md has the full reference)
    measure: str  #: ``ettr`` (a fraction) or ``downtime`` (seconds per failure)
    value: float
    relation: str  #: ``at least`` (a bound) or ``about``
    n: int
    days: float  #: the job's length (the model's horizon)
    variant: Variant
    given: dict[str, str]  #: the report's parameters, as scale options
    assumed: tuple[str, ...]  #: what the report does not state, and the value taken


#: Llama 3 405B: 54 days, 466 interruptions of which 419 unexpected, on 16,384 H100s
#: (mttf per GPU = 16,384 * 54 * 24 h / 419); Tectonic storage sustains 2 TB/s; 400 Gb/s
#: per GPU; state = 405e9 parameters * 16 bytes (bf16 weights, fp32 master and Adam
#: moments) / 16,384; a step of 16M tokens at ~400 TFLOP/s per GPU: 6 * 405e9 * 16e6 /
#: (16,384 * 400e12) = 5.9 s.
PUBLISHED: tuple[Published, ...] = (
    Published("Meta Llama 3 405B pre-training", "Llama Team (Dubey et al.) 2024, §3.3", "ettr", 0.90,
              "at least", 16_384, 54.0, BY_NAME["checkpoint-restart/young-daly"],
              {"mttf_hours": f"{16_384 * 54 * 24 / 419:.0f}", "storage_total_gbps": "2000",
               "network_gbps": "50", "state_gb": "0.40", "step_seconds": "5.9"},
              ("checkpoint interval: Young/Daly's", "restart and re-formation: measured here",
               "per-GPU storage link: 1 GB/s")),
    Published("ByteRobust, 9,600 GPUs over three months", "Wan et al. 2025", "ettr",
              0.97, "about", 9_600, 90.0, MEMORY_WARM, {},
              ("failure rate: Meta's 1.8 h at 16,384 GPUs", "state 2 GB, step 4 s",
               "in-memory checkpoints at Young/Daly's interval, warm spares",
               "restart and re-formation: measured here")),
    Published("TrainMover, downtime per failure at 1,024 GPUs", "Lao et al. 2024", "downtime",
              20.0, "about", 1_024, 7.0, BY_NAME["checkpoint-restart/warm-spares"], {},
              ("failure rate: Meta's", "state 2 GB, step 4 s", "warm spares (standby machines)",
               "restart and re-formation: measured here")),
    Published("FlashRecovery, recovery at 4,800 devices", "Zhang et al. 2025", "downtime",
              150.0, "about", 4_800, 7.0, BY_NAME["checkpoint-restart/in-memory"], {},
              ("failure rate: Meta's", "state 2 GB, step 4 s",
               "state restored from a peer's memory (checkpoint-free)",
               "restart and re-formation: measured here")),
)


@dataclass(frozen=True)
class Checked:
    """The model's figure for one published point."""

    point: Published
    params: ScaleParams
    ours: float  #: same measure as ``point.value``
    failures: float  #: per run, mean over the seeds
    #: ettr: seconds of downtime per failure the model would have to add to take the
    #: report's time; downtime: the published figure over ours
    gap: float

    @property
    def difference(self) -> float:
        return self.ours - self.point.value

    @property
    def within(self) -> bool:
        """Within the stated margin (a bound: on its side of it, or within the margin)."""
        if self.point.measure == "ettr":
            if self.point.relation == "at least" and self.ours >= self.point.value:
                return True
            return abs(self.difference) <= ETTR_MARGIN
        return 1 / DOWNTIME_FACTOR <= self.ours / self.point.value <= DOWNTIME_FACTOR


def check(point: Published, base: ScaleParams, seeds: int = 2) -> Checked:
    """Run the model for ``point`` (``base``: the suite's parameters, the report's own
    over them) on ``seeds`` seeds."""
    p = parse(point.given, base)
    p = replace(p, sizes=(point.n,), steps=max(1, round(point.days * DAY / p.step_seconds)))
    runs: list[Outcome] = [simulate(point.variant, p, point.n, s) for s in range(seeds)]
    failures = sum(o.failures for o in runs) / len(runs)
    if point.measure == "ettr":
        ours = mean_goodput(runs)
        took = sum(o.seconds for o in runs) / len(runs)
        ideal = sum(o.ideal_seconds for o in runs) / len(runs)
        gap = (ideal / point.value - took) / failures if failures else 0.0
    else:
        downs = [d for o in runs for d in o.downtimes]
        ours = sum(downs) / len(downs) if downs else 0.0
        gap = point.value / ours if ours > 0 else float("inf")
    return Checked(point, p, ours, failures, gap)
