"""Bucketed gradient averaging with the semantics of an allreduce, interruptible.

The gradient is one flat vector (parameters concatenated in their order) cut into
``B`` contiguous buckets, reduced one after the other as DDP does: by default buckets
of about :data:`BUCKET_BYTES` (DDP's ``bucket_cap_mb``, 25 MB; the first one smaller,
:data:`FIRST_BUCKET_BYTES`, so the first allreduce starts early in the backward), or
``B`` equal ones when the run names a count (:func:`plan_buckets`). A failure may
interrupt the reduction after ``k`` buckets: those hold the average, and which buckets
hold a result is counted apart from the values (:attr:`Reduced.counts`; the step's
:class:`~trainthrough.dp.step.InFlight` keeps the same), so a partly reduced gradient
is never applied by mistake and a user's NaN or inf is never taken for a gap.

Contributions are micro-batch gradients tagged with their index in the global batch
(see :mod:`trainthrough.dp.batching`), and every bucket is summed in index order,
whichever rank computed which micro-batch. Float addition is not associative, so
this fixed order is what makes a step bit-for-bit the same on N or N-1 ranks; a real
engine gets the same by reducing in micro-batch order, or accepts last-bit noise.
The average is over the contributions that arrived, which is how lossy-forward
recovery drops a failed rank's share. Everything here is pure tensor code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Contribution = tuple[int, torch.Tensor]  # (micro-batch index, flat gradient)

BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb
FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket: the backward's first gradients go at once
ELEMENT_BYTES = 4  # the flat gradient is float32


@dataclass(frozen=True)
class Bucket:
    """Elements ``[start, stop)`` of the flat gradient, reduced as one message."""

    index: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


class FlatLayout:
    """Where each parameter sits in the flat vector (parameter order is dict order)."""

    def __init__(self, like: dict[str, torch.Tensor]) -> None:
        self.names = list(like)
        self.shapes = {n: like[n].shape for n in self.names}
        self.numel = sum(like[n].numel() for n in self.names)

    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """One vector; a parameter missing from ``tensors`` contributes zeros."""
        return torch.cat([tensors[n].reshape(-1) if n in tensors
                          else torch.zeros(self.shapes[n].numel()) for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, at = {}, 0
        for n in self.names:
            k = self.shapes[n].numel()
            out[n] = flat[at:at + k].view(self.shapes[n])
            at += k
        return out


def make_buckets(numel: int, count: int, weights: Sequence[float] | None = None
                 ) -> tuple[Bucket, ...]:
    """Cut ``numel`` elements into ``count`` contiguous buckets in parameter order.

    Args:
        numel: length of the flat gradient.
        count: number of buckets B (at most ``numel``).
        weights: relative bucket sizes (default: equal).

    Raises:
        ValueError: no buckets, more buckets than elements, or bad weights.
    """
    if not 1 <= count <= numel:
        raise ValueError(f"need between 1 and {numel} buckets (got {count})")
    w = list(weights) if weights is not None else [1.0] * count
    if len(w) != count or min(w) <= 0:
        raise ValueError(f"need {count} positive bucket weights (got {w})")
    total, acc, bounds = sum(w), 0.0, [0]
    for x in w[:-1]:
        acc += x
        bounds.append(round(numel * acc / total))
    bounds.append(numel)
    for i in range(1, count + 1):  # every bucket keeps at least one element
        bounds[i] = min(max(bounds[i], bounds[i - 1] + 1), numel - (count - i))
    return tuple(Bucket(i, bounds[i], bounds[i + 1]) for i in range(count))


def plan_buckets(numel: int, count: int | None) -> tuple[Bucket, ...]:
    """The run's buckets: ``count`` equal ones, or (None) buckets of :data:`BUCKET_BYTES`
    after a first one of :data:`FIRST_BUCKET_BYTES` (one bucket for a small model).

    Raises:
        ValueError: ``count`` is not between 1 and ``numel``.
    """
    if count is not None:
        return make_buckets(numel, count)
    first, rest = FIRST_BUCKET_BYTES // ELEMENT_BYTES, BUCKET_BYTES // ELEMENT_BYTES
    if numel <= first + rest:
        return make_buckets(numel, 1)
    sizes = [first] + [rest] * ((numel - first) // rest)
    sizes[-1] += numel - sum(sizes)  # the tail joins the last bucket (at most 2x a bucket)
    return make_buckets(numel, len(sizes), [float(x) for x in sizes])


class Grads:
    """One rank's gradients for one step: the micro-batches it computed, as the
    allreduce takes them (:meth:`contributions`).

    Kept apart, one flat vector per micro-batch (``separate``: the simulated host
    sums every rank's micro-batches in index order, so a step is the same bit for bit
    on N or N-1 ranks), or summed in place into one flat vector :attr:`flat`
    (a real host: each rank sums its own, then the ranks; one gradient's memory
    whatever the number of micro-batches). A replica may accumulate into ``flat``
    itself (a user's model: its ``.grad`` are views of it) and record each
    micro-batch with :meth:`mark`. A ``fresh`` vector holds stale values (a replica's
    buffer from its last step): the first micro-batch writes it whole, or
    :meth:`settle` zeroes it, so it needs no zeroing before every step.
    """

    def __init__(self, numel: int, *, separate: bool, flat: torch.Tensor | None = None,
                 device: torch.device | None = None, fresh: bool = False) -> None:
        self.numel, self.separate, self.fresh = numel, separate, fresh and flat is not None
        self.device = flat.device if flat is not None else (device or torch.device("cpu"))
        self.parts: list[Contribution] = []
        self.flat: torch.Tensor | None = None
        if not separate:
            self.flat = flat if flat is not None else torch.zeros(numel, device=self.device)
        self.indices: list[int] = []  # micro-batches whole in here, in the order added

    def add(self, index: int, g: torch.Tensor) -> None:
        """Take micro-batch ``index``'s flat gradient ``g`` (kept, or added into :attr:`flat`)."""
        if self.flat is None:
            self.parts.append((index, g))
        else:
            self.settle()
            self.flat.add_(g)
        self.indices.append(index)

    def settle(self) -> None:
        """A :attr:`fresh` vector becomes zeros (nothing written yet)."""
        if self.fresh and self.flat is not None:
            self.flat.zero_()
        self.fresh = False

    def mark(self, index: int) -> None:
        """Micro-batch ``index`` was accumulated into :attr:`flat` by the replica itself."""
        self.indices.append(index)

    def contributions(self) -> list[Contribution]:
        """What the collective sums: the parts, or the sum (with the micro-batch whose
        backward is under way: a bucket is started when its elements are whole)."""
        if self.flat is None:
            return list(self.parts)
        self.settle()  # nothing computed here (an empty share): zeros
        return [(min(self.indices, default=-1), self.flat)]


@dataclass
class Reduced:
    """A (possibly partly) reduced gradient: ``counts[b]`` contributions in bucket b."""

    flat: torch.Tensor
    counts: list[int]

    @property
    def completed(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.counts) if c > 0)

    @property
    def complete(self) -> bool:
        return all(c > 0 for c in self.counts)


def allreduce(contributions: Sequence[Contribution], buckets: Sequence[Bucket], *,
              mean: bool = True, stop_after: int | None = None,
              into: Reduced | None = None) -> Reduced:
    """Reduce buckets in order, summing contributions in micro-batch order.

    Args:
        contributions: ``(micro-batch index, flat gradient)`` from every rank taking part.
        buckets: from :func:`make_buckets`.
        mean: divide each bucket by the number of contributions (``sum`` workloads: no).
        stop_after: reduce only buckets with index below this (a failure interrupts
            the allreduce after that many buckets).
        into: a partly reduced result to finish; its completed buckets are kept as
            they are (lossy-forward completes the rest among the survivors).

    Returns:
        The reduced gradient; ``completed`` says which buckets hold a result.

    Raises:
        ValueError: no contributions, or two with the same micro-batch index.
    """
    ordered = sorted(contributions, key=lambda c: c[0])
    if not ordered:
        raise ValueError("an allreduce needs at least one contribution")
    if len({i for i, _ in ordered}) != len(ordered):
        raise ValueError("two contributions share a micro-batch index")
    numel = ordered[0][1].numel()
    out = into or Reduced(torch.full((numel,), float("nan")), [0] * len(buckets))
    stop = len(buckets) if stop_after is None else stop_after
    for b in buckets[:stop]:
        if out.counts[b.index]:
            continue
        acc = bucket_sum(ordered, b)
        if mean:
            acc.div_(len(ordered))
        out.flat[b.start:b.stop] = acc
        out.counts[b.index] = len(ordered)
    return out


def bucket_sum(parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
    """Elements ``bucket`` of the contributions, summed in the order given (a new tensor).

    Pass them sorted by micro-batch index for a sum that does not depend on which
    rank sent what (see the module docstring)."""
    acc = parts[0][1][bucket.start:bucket.stop].clone()
    for _, g in parts[1:]:
        acc.add_(g[bucket.start:bucket.stop])
    return acc


def ring_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """Time of a ring allreduce of one ``nbytes`` message over ``ranks`` ranks.

    Each rank sends and receives ``2 (n-1)/n`` of the message (reduce-scatter, then
    all-gather) over its own link; one rank alone does not communicate.
    """
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + latency
