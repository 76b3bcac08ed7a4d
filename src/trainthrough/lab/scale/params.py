"""The scale suite's parameters: one typed, bounded field each, all ``--option``s.

``trainthrough compare --suite scale --option mttf_hours=8000 --option sizes=8,1024``
overrides any of them; the report writes every value it used. Defaults are the
published figures (docs/scale-suite.md cites each) and the costs measured on this
machine (:mod:`trainthrough.lab.scale.measured`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, get_type_hints

from trainthrough.errors import UserError
from trainthrough.fields import FLOAT_TEXT, INT_TEXT, bounded, check_fields
from trainthrough.ft.dp_policies import ELASTIC
from trainthrough.lab.scale import measured as m

#: Meta's research clusters: a 16,384-GPU job is expected to fail every 1.8 h
#: (Kokolis et al., 2024; docs/scale-suite.md), i.e. 1.8 * 16,384 accelerator-hours
#: between failures of one accelerator (what drops a job, node faults included).
META_MTTF_HOURS = 1.8 * 16_384
SIZES = (8, 64, 1_024, 16_384, 100_000)
QUICK_SIZES = (8, 1_024, 100_000)


@dataclass(frozen=True)
class ScaleParams:
    """Everything the model needs; seconds, GB (1e9 bytes) and GB/s."""

    #: cluster sizes, accelerators (each one data-parallel rank)
    sizes: tuple[int, ...] = SIZES
    #: mean time between failures of one accelerator, hours (failures are exponential)
    mttf_hours: float = bounded(META_MTTF_HOURS, gt=0)
    steps: int = bounded(100_000, ge=1)  #: steps to train (the horizon)
    step_seconds: float = bounded(4.0, gt=0)  #: one failure-free synchronous step
    #: share of that step that is the gradient collective (relaxed sync skips it on
    #: inner steps and pays it once per outer step)
    comm_share: float = bounded(0.2, ge=0, le=1)
    state_gb: float = bounded(2.0, gt=0)  #: checkpointed state per accelerator
    storage_gbps: float = bounded(1.0, gt=0)  #: one accelerator's link to remote storage
    #: remote storage's aggregate bandwidth (Llama 3: Tectonic sustains 2 TB/s)
    storage_total_gbps: float = bounded(2_000.0, gt=0)
    network_gbps: float = bounded(50.0, gt=0)  #: per accelerator (400 Gb/s, Llama 3)
    detect_seconds: float = bounded(m.DETECT_SECONDS, ge=0)  #: failure to detection
    reform_seconds: float = bounded(m.REFORM_SECONDS, ge=0)  #: re-formation, fixed part
    #: re-formation's part that grows with the group: the store's work per rank, ms
    rendezvous_ms: float = bounded(m.RENDEZVOUS_MS_PER_RANK, ge=0)
    cold_join_seconds: float = bounded(m.COLD_JOIN_SECONDS, ge=0)  #: replacement, no spare
    warm_join_seconds: float = bounded(m.WARM_JOIN_SECONDS, ge=0)  #: replacement, warm spare
    #: every rank relaunched to its first step (cold), rendezvous and read apart
    restart_seconds: float = bounded(m.COLD_RESTART_SECONDS, ge=0)
    warm_restart_seconds: float = bounded(m.WARM_RESTART_SECONDS, ge=0)  #: same, warm spares
    write_efficiency: float = bounded(m.WRITE_EFFICIENCY, gt=0, le=1)  #: of storage bandwidth
    transfer_efficiency: float = bounded(m.TRANSFER_EFFICIENCY, gt=0, le=1)  #: of network
    checkpoint_every: int = bounded(450, ge=1)  #: steps, checkpoint-restart's fixed interval
    sync_every: int = bounded(100, ge=1)  #: H, inner steps per outer step (relaxed sync)
    sync_fragments: int = bounded(4, ge=1)  #: F, streaming DiLoCo's fragments
    elastic: str = bounded("keep-global", choices=ELASTIC)  #: what a smaller group trains on
    #: run the validation against published figures (lab/scale/validation.py)
    validate: bool = True

    def __post_init__(self) -> None:
        check_fields(self, label=lambda k: f"scale option {k}")
        if self.sync_fragments > self.sync_every:
            raise UserError(f"scale option sync_fragments must be at most sync_every "
                            f"({self.sync_every}) (got {self.sync_fragments})")
        if not self.sizes:
            raise UserError("scale option sizes needs at least one size")
        for s in self.sizes:
            if not isinstance(s, int) or s < 1:
                raise UserError(f"scale option sizes must be whole numbers of at least 1 "
                                f"(got {s!r})")

    @property
    def mttf_seconds(self) -> float:
        return self.mttf_hours * 3600.0

    def rows(self) -> list[tuple[str, str]]:
        """Every parameter as (name, value), in declaration order, for the report."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            text = (",".join(map(str, v)) if isinstance(v, tuple) else
                    f"{v:g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool)
                    else str(v))
            out.append((f.name, text))
        return out


_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _value(key: str, text: str, hint: Any) -> Any:
    if hint == "tuple[int, ...]":
        parts = [p.strip() for p in text.split(",")]
        if not parts or not all(INT_TEXT.fullmatch(p) for p in parts):
            raise UserError(f"scale option {key} must be whole numbers separated by commas "
                            f"(got {text!r})")
        return tuple(int(p) for p in parts)
    if hint == "bool":
        if text.lower() not in _BOOLS:
            raise UserError(f"scale option {key} must be true or false (got {text!r})")
        return _BOOLS[text.lower()]
    if hint == "int":
        if not INT_TEXT.fullmatch(text):
            raise UserError(f"scale option {key} must be a whole number (got {text!r})")
        return int(text)
    if hint == "float":
        if not FLOAT_TEXT.fullmatch(text):
            raise UserError(f"scale option {key} must be a number (got {text!r})")
        return float(text)
    return text


def parse(options: dict[str, str], base: ScaleParams | None = None) -> ScaleParams:
    """``base`` (the defaults) with ``options`` (``key -> text``) applied and checked.

    Raises:
        UserError: an unknown key, or a value of the wrong type or out of its bounds.
    """
    base = base or ScaleParams()
    hints = {f.name: str(f.type) for f in fields(ScaleParams)}
    get_type_hints(ScaleParams)  # the annotations resolve (a typo here is ours, not the user's)
    values: dict[str, Any] = {}
    for key, text in options.items():
        if key not in hints:
            raise UserError(f"the scale suite has no option {key!r}; its options: "
                            f"{', '.join(hints)}")
        values[key] = _value(key, text, hints[key])
    return replace(base, **values)
