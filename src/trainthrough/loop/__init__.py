"""Bring your own loop: a user's PyTorch training loop, data parallel, surviving lost ranks.

Your model, optimizer, loss and ``DataLoader`` stay yours; a handful of lines hand
the step to trainthrough::

    from trainthrough.loop import Loop, launch, training_loop

    @training_loop(metric="accuracy", direction="max")
    def train(loop: Loop) -> dict:
        model, opt = Net(), torch.optim.SGD(...)
        loader = DataLoader(train_set, batch_size=32, collate_fn=...)
        loop.attach(model, opt, loader, evaluate=lambda: accuracy(model))   # +1
        while loop.running(epochs=2):                                       # +1
            loop.step(lambda batch: F.cross_entropy(model(batch[0]), batch[1]))  # +1
        return {"accuracy": accuracy(model)}

    if __name__ == "__main__":
        print(launch(train, ranks=4, strategy="rollback", fail=["rank=1@iter=30"]))

Every rank runs ``train`` in its own process (on a Ray node by default, a local process
with ``engine="gloo"``), imported by reference from its file: nothing is pickled. Each
``loop.step`` is one global mini-batch: trainthrough picks this rank's samples from
``loader.dataset`` (so a recovery never skips or repeats one), calls your loss on each
micro-batch, averages gradients and buffers over the ranks, and applies your
optimizer; a failure is recovered inside the call, as the strategy says
(:mod:`trainthrough.ft.dp_policies`, the same policies as every engine).

This layer sits above :mod:`trainthrough.lab` (``launch`` runs through
:func:`trainthrough.lab.runner.run`) and under the CLI only. The marker's type,
:class:`~trainthrough.workloads.user_loop.TrainingLoop`, and the run's view of a loop
(:class:`~trainthrough.workloads.user_loop.LoopWorkload`) are workloads and live in that
layer; the engines start a loop's ranks by the name the marker carries
(:data:`~trainthrough.loop.api.RANK_ENTRY`), never by importing this package.
"""

from trainthrough.loop.api import Loop, training_loop
from trainthrough.loop.launch import LoopResult, launch

__all__ = ["Loop", "LoopResult", "launch", "training_loop"]
