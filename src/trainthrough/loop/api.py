"""What a user's loop sees: the :func:`training_loop` marker and the :class:`Loop` handle.

Call order inside ``train(loop)`` (on every rank): build the model, optimizer and
``DataLoader`` (and schedulers, scalers, an EMA: registered with ``state=``);
:meth:`Loop.attach` once; then ``while loop.running(epochs=E): loop.step(loss_fn)``,
or ``loop.step(loss_fn, update)`` to keep your own step (clipping, a ``GradScaler``,
a scheduler) on the averaged gradients; return a JSON-able value (the first rank's is
reported). docs/own-loop.md says what may go in ``loss_fn`` and ``update``.

The marker type, :class:`~trainthrough.workloads.user_loop.TrainingLoop`, describes a
workload and lives in that layer; :func:`training_loop` fills it in with this layer's
rank program (:data:`RANK_ENTRY`), which the engines start by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch

from trainthrough.dp.hooks import Hooks
from trainthrough.dp.module_replica import ModuleReplica, StepFns
from trainthrough.dp.rank import micro_seed
from trainthrough.errors import Retired, UserError
from trainthrough.workloads.user_loop import TrainFn, TrainingLoop

if TYPE_CHECKING:
    from trainthrough.engines.gloo.session import RankSession

#: What each rank process of a loop's run calls, ``run_loop(spec, store)``, as a
#: ``module:function`` name carried by the marker (:mod:`trainthrough.loop.rank`).
RANK_ENTRY = "trainthrough.loop.rank:run_loop"


def training_loop(fn: TrainFn | None = None, *, metric: str = "loss",
                  direction: Literal["max", "min"] = "min", target: float | None = None,
                  eval_every: int = 10, checkpoint_every: int = 50) -> Any:
    """Mark ``fn(loop)`` as a training loop trainthrough can run on every rank.

    Usable bare (``@training_loop``) or with the metric its ``evaluate`` returns
    (``@training_loop(metric="accuracy", direction="max", target=0.9)``). A marked
    loop is also a workload reference: ``trainthrough run --paradigm dp --engine ray
    --workload file.py:train``.
    """
    if direction not in ("max", "min"):
        raise UserError(f"training_loop direction must be max or min (got {direction!r})")

    def mark(f: TrainFn) -> TrainingLoop:
        return TrainingLoop(f, RANK_ENTRY, metric, direction, target, eval_every,
                            checkpoint_every)

    return mark(fn) if fn is not None else mark


class Loop:
    """A rank's handle on the run, given to ``train(loop)``.

    Attributes read in a loss function or a print: :attr:`device` (where to put the
    model: ``model.to(loop.device)``), :attr:`rank` (this rank's slot),
    :attr:`ranks` (the group's size now), :attr:`step_index` (committed steps so far:
    the step being taken), :attr:`attempt` (the group incarnation), :attr:`epoch`.
    """

    def __init__(self, attach: Callable[..., tuple[RankSession, ModuleReplica]], slot: int,
                 device: torch.device | None = None) -> None:
        self._attach, self.rank = attach, slot
        #: Where this rank's model belongs (``--device``; ``auto``: its own GPU when
        #: CUDA is present, else the CPU): ``model.to(loop.device)`` before attach.
        self.device = device if device is not None else torch.device("cpu")
        self._session: RankSession | None = None
        self._replica: ModuleReplica | None = None  # this rank's model, as the step sees it
        self._epochs: int | None = None
        self._hooks = Hooks()
        self._size = 0  # the group's size at the last step (when the epochs are over)

    # -- set-up -------------------------------------------------------------------
    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               loader: torch.utils.data.DataLoader,  # type: ignore[type-arg]
               evaluate: Callable[[], float] | None = None, *,
               state: Mapping[str, Any] | None = None,
               on_epoch_end: Callable[[int], object] | None = None,
               on_eval: Callable[[int], object] | None = None) -> None:
        """Hand the model, the optimizer and the data over; joins the run.

        The ``DataLoader`` gives the dataset (map-style: indexable, with a length), the
        per-rank ``batch_size`` and the ``collate_fn``; trainthrough decides which
        samples each rank takes at each step (its sampler and shuffling are not used:
        the order is an epoch permutation seeded by the run's seed). What the
        ``collate_fn`` returns is moved to the model's device (tensors nested in
        tuples, lists and dicts), as ``DistributedDataParallel`` moves its inputs: a
        ``collate_fn`` may also return device tensors itself. ``evaluate``
        (optional) scores the model, on the first rank, every ``eval_every`` steps.

        ``state``: every other object the run must carry, by name (an LR scheduler, a
        ``GradScaler``, an EMA model, a second optimizer, your own counters): anything
        with ``state_dict()`` and ``load_state_dict()`` whose state is tensors, numbers,
        strings, lists, tuples and dicts. It is saved in every checkpoint, restored in a
        restarted rank and sent to a joining one with the model, as tensors and JSON.

        ``on_epoch_end(epoch)``: after the last step of each epoch; ``on_eval(step)``:
        after every ``eval_every``-th committed step. Both run on every rank, once per
        committed epoch or step (never again after a rollback; a restarted rank replays
        those after its checkpoint), at the start of the next step or at the end.

        A restarted rank (checkpoint-restart) loads the checkpoint here; a joining one
        receives a live peer's state at its first step.

        Raises:
            UserError: called twice, a dataset without a length, no batch size, a
                ``state`` object that cannot be saved without pickle.
        """
        if self._session is not None:
            raise UserError("loop.attach was called twice")
        ds = loader.dataset
        if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
            raise UserError("loop.attach needs a map-style dataset (with __getitem__ and "
                            "__len__): trainthrough picks the samples of every rank")
        if loader.batch_size is None:
            raise UserError("loop.attach needs a DataLoader with a batch_size (per rank)")
        collate = loader.collate_fn

        def fetch(rows: torch.Tensor) -> Any:
            return collate([ds[i] for i in rows.tolist()])

        self._hooks = Hooks(on_epoch_end, on_eval)
        self._session, self._replica = self._attach(model, optimizer, fetch, len(ds),
                                                    loader.batch_size, evaluate, state,
                                                    self._hooks)
        self._session.begin()

    # -- the loop -----------------------------------------------------------------
    def running(self, epochs: int = 1) -> bool:
        """Whether to take another step: False once ``epochs`` passes over the data are
        done, or the run stops (its target, its wall limit)."""
        s = self._need()
        if self._epochs is None:
            if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
                raise UserError(f"loop.running(epochs=...) must be a positive int (got {epochs!r})")
            self._epochs = epochs
            s.tr.limit_epochs = epochs
        elif epochs != self._epochs:
            raise UserError("loop.running was given a different number of epochs")
        if s.g is not None:
            self._size = s.g.size
        if not s.over and s.g is not None and s.tr.finished(s.g.size):
            self._last_callbacks()
            s.close(final=True)
        return not s.over

    def step(self, loss_fn: Callable[[Any], torch.Tensor],
             update: Callable[[], object] | None = None) -> float:
        """Take one global step: ``loss_fn(batch)`` on each of this rank's micro-batches
        (``batch`` is what the ``collate_fn`` made of them), the gradients averaged over
        the group, then the update. A lost rank is recovered inside the call.

        ``update``: your own step, run once the group committed the gradients, with
        every parameter's ``.grad`` set to the gradient averaged over the global batch
        (the same on every rank): clip it, ``scaler.step(optimizer)``, step a
        scheduler, update an EMA, as after ``loss.backward()`` in a plain loop
        (docs/own-loop.md says what may go there). Without it, ``optimizer.step()``.
        Gradients are zeroed after it.

        Returns:
            The mean of this rank's micro-batch losses in the committed step (NaN if
            the run ended before it could commit one; divided by the scale when a
            ``GradScaler`` is registered, whose ``scale`` the loss function applies).

        Raises:
            UserError: the loss or the averaged gradient is not finite with no
                ``GradScaler`` registered (it names the rank, the step and the value).
        """
        s = self._need()
        assert self._replica is not None  # attached with the session
        losses = self._replica.begin_step(StepFns(loss_fn, update))
        if s.g is not None:
            self._size = s.g.size
        if not s.step():
            if s.retired:
                raise Retired()
            self._last_callbacks()
            return float("nan")
        # A rolled-back step computes its micro-batches again: the last attempt's count.
        done = losses[-len(s.tr.last_share):] if s.tr.last_share else []
        return sum(done) / len(done) if done else float("nan")

    def _last_callbacks(self) -> None:
        """The loop's epochs are done: the callbacks of the last epoch and step run (a
        run stopped early, by its target or wall limit, ends no epoch)."""
        s = self._need()
        if self._size and not s.retired and s.tr.epochs_over(self._size):
            self._hooks.before(s.tr.limit_epochs or 0, s.tr.logical,
                               micro_seed(s.tr.cfg.seed, s.tr.logical, -2))

    # -- what a loop may read -------------------------------------------------------
    @property
    def ranks(self) -> int:
        s = self._need()
        return s.g.size if s.g is not None else 0

    @property
    def step_index(self) -> int:
        return self._need().tr.logical

    @property
    def attempt(self) -> int:
        return self._need().tr.attempt

    @property
    def epoch(self) -> int:
        return self._need().tr.cursor.epoch

    def _need(self) -> RankSession:
        if self._session is None:
            raise UserError("call loop.attach(model, optimizer, loader) first")
        return self._session
