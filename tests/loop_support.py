"""A trainer, an evaluator and a controller for tests, built through `harness.train.factory` as `harness train`
builds them (a backend over the test's strategy, the plan's batch sizes)."""
from __future__ import annotations

import dataclasses

from harness.distribute.backend import TrainingBackend
from harness.distribute.batch import batch_sizes
from harness.distribute.context import WorkerContext
from harness.train import factory, metrics as metrics_lib
from harness.train.controller import Controller, Schedule


@dataclasses.dataclass
class Run:
    trainer: object
    controller: Controller
    evaluator: object
    on_epoch_end: tuple = ()

    def fit(self, iterator, on_epoch_end=None, **kwargs):
        if on_epoch_end is not None:
            self.controller.on_epoch_end = tuple(on_epoch_end)
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
          clip_norm=None, class_weights=None, step_hooks=(), timer=None, on_epoch_end=(), callbacks=None) -> Run:
    """`Run` over `strategy` (or `backend`); `global_batch_size` examples per step over every replica (and
    rank); `metrics` default: classification over the model's last axis."""
    if backend is None:
        context = context or WorkerContext.single(replicas_per_worker=strategy.num_replicas_in_sync)
        backend = TrainingBackend(strategy, context)
    c = backend.context
    batch = batch_sizes(workers=c.num_workers, replicas_per_worker=c.replicas_in_sync // c.num_workers,
                        global_batch_size=global_batch_size)
    trainer = factory.make_trainer(backend, model, optimizer, batch, loss_fn=loss_fn, class_weights=class_weights,
                                   clip_norm=clip_norm)
    evaluator = factory.make_evaluator(backend, model, metrics or metrics_lib.Classification(model.output_shape[-1]),
                                       loss_fn=loss_fn)
    controller = Controller(trainer, Schedule(epochs=epochs, steps_per_epoch=steps_per_epoch,
                                              steps_per_loop=steps_per_loop, warmup_steps=warmup_steps),
                            context=c, evaluator=evaluator, step_hooks=step_hooks, timer=timer,
                            on_epoch_end=on_epoch_end, callbacks=callbacks)
    return Run(trainer, controller, evaluator)
