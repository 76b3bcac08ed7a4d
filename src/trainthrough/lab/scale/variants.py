"""What the scale suite compares: each data-parallel preset, and checkpoint-restart's
variants (its Young/Daly interval, peer memory, warm spares).

A variant is a preset of ft/strategy.py (whose mechanisms the model asks for their
decisions) plus what the preset leaves to the deployment: the checkpoint interval
(fixed, or Young/Daly's for the cost at that size), where checkpoints go and whether
a warm spare replaces a failed accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainthrough.ft.strategy import PRESETS, Strategy


@dataclass(frozen=True)
class Variant:
    """One line of the plot."""

    name: str
    preset: str  #: the strategy preset whose policies decide
    interval: str = "fixed"  #: ``fixed`` (the checkpoint_every option) or ``young-daly``
    store: str = "remote"  #: ``remote`` storage or a peer's ``memory``
    warm: bool = False  #: a warm spare replaces a failed accelerator

    @property
    def strategy(self) -> Strategy:
        return PRESETS[self.preset]

    @property
    def relaxed(self) -> bool:
        return self.strategy.relaxed

    def describe(self) -> str:
        s = self.strategy
        parts = [s.description.split(";")[0]]
        if s.checkpoint != "none":
            where = "remote storage" if self.store == "remote" else "a peer's memory"
            when = ("its Young/Daly interval" if self.interval == "young-daly"
                    else "checkpoint_every steps")
            parts.append(f"checkpoints to {where} at {when}")
        parts.append("warm spares" if self.warm else "replacements started cold")
        return "; ".join(parts)


VARIANTS: tuple[Variant, ...] = (
    Variant("checkpoint-restart", "checkpoint-restart"),
    Variant("checkpoint-restart/young-daly", "checkpoint-restart", interval="young-daly"),
    Variant("checkpoint-restart/in-memory", "checkpoint-restart", interval="young-daly",
            store="memory"),
    Variant("checkpoint-restart/warm-spares", "checkpoint-restart", interval="young-daly",
            warm=True),
    Variant("rollback", "rollback"),
    Variant("lossy-forward", "lossy-forward"),
    Variant("localsgd", "localsgd"),
    Variant("diloco", "diloco"),
    Variant("streaming-diloco", "streaming-diloco"),
)
BY_NAME = {v.name: v for v in VARIANTS}
