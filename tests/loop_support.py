"""A trainer, an evaluator and a controller for tests, built by `harness.train.loop.factory.build_run` as `harness
train` builds them (a backend over the test's strategy, the plan's batch sizes)."""
from __future__ import annotations

import dataclasses

from harness.distribute.backend import TrainingBackend
from harness.distribute.batch import batch_sizes
from harness.distribute.context import WorkerContext
from harness.train.loop import factory
from harness.train.model import metrics as metrics_lib
from harness.train.loop.controller import Controller, EpochEnd, Schedule


@dataclasses.dataclass
class Run:
    trainer: object
    controller: Controller
    evaluator: object

    def fit(self, iterator, backup=None, **kwargs):
        """`controller.fit`; with `backup`, the controller writes it at each epoch end."""
        if backup is not None:
            self.controller.backup = backup
        return self.controller.fit(iterator, **kwargs)

    @property
    def timer(self):
        return self.controller.timer

    @property
    def steps_per_loop(self):
        return self.controller.steps_per_loop

    @property
    def context(self):
        return self.controller.context

    def train_step(self, batch) -> float:
        """One host-fed step; its loss (averaged over ranks)."""
        return float(self.trainer.train_step(batch)[0])

    def evaluate(self, dataset) -> dict:
        return self.evaluator.evaluate(dataset)


def build(strategy, model, optimizer, *, global_batch_size: int, epochs: int = 1, steps_per_epoch: int = 1,
          steps_per_loop=None, warmup_steps: int = 2, context=None, backend=None, loss_fn=None, metrics=None,
          clip_norm=None, class_weights=None, actions=(), timer=None, on_epoch_end=(), callbacks=None,
          backup=None) -> Run:
    """`Run` over `strategy` (or `backend`); `global_batch_size` examples per step over every replica (and
    rank); `metrics` default: classification over the model's last axis; `on_epoch_end`: functions `(epoch, logs)`
    run after `actions`."""
    if backend is None:
        context = context or WorkerContext.single(replicas_per_worker=strategy.num_replicas_in_sync)
        backend = TrainingBackend(strategy, context)
    c = backend.context
    batch = batch_sizes(workers=c.num_workers, replicas_per_worker=c.replicas_in_sync // c.num_workers,
                        global_batch_size=global_batch_size)
    run = factory.build_run(backend, model, optimizer, batch,
                            Schedule(epochs=epochs, steps_per_epoch=steps_per_epoch, steps_per_loop=steps_per_loop,
                                     warmup_steps=warmup_steps),
                            loss_fn=loss_fn, class_weights=class_weights, clip_norm=clip_norm,
                            metrics=metrics or metrics_lib.Classification(model.output_shape[-1]),
                            actions=(*actions, *map(EpochEnd, on_epoch_end)), timer=timer, callbacks=callbacks,
                            backup=backup)
    return Run(run.trainer, run.controller, run.evaluator)
