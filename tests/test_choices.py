"""Every choice list lives once, in `harness.choices` (no TensorFlow): each command-line flag offers exactly its list,
and every table or branch that implements the names covers exactly the list (issue 19, item 4)."""
import argparse
import ast
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from harness import choices, cli
from harness.errors import ConfigError

# (subcommand path, flag) -> the list in harness.choices it must offer. Every flag with `choices=` is here, so a
# new flag written with its own literal list fails `test_every_flag_offers_its_list`.
FLAGS = {
    (("train",), "--task"): choices.TASKS,
    (("train",), "--precision"): choices.PRECISIONS,
    (("train",), "--strategy"): choices.STRATEGIES,
    (("train",), "--cache"): choices.CACHE_MODES,
    (("train",), "--backend"): choices.BACKENDS,
    (("bench", "train"), "--backend"): choices.BACKENDS,
    (("train",), "--parse"): choices.PARSE_PLACEMENTS,
    (("bench", "allreduce"), "--backend"): choices.BACKENDS,
    (("bench", "scale"), "--backend"): choices.BACKENDS,
    (("bench", "scale"), "--algorithm"): choices.ALLREDUCE_ALGORITHMS,
    (("train",), "--optimizer"): choices.OPTIMIZERS,
    (("train",), "--schedule"): choices.SCHEDULES,
    (("train",), "--scale-lr"): choices.LR_SCALINGS,
    (("bench", "train"), "--precision"): choices.PRECISIONS,
    (("bench", "train"), "--strategy"): choices.STRATEGIES,
    (("bench", "train"), "--cache"): choices.CACHE_MODES,
    (("plan",), "--scale-lr"): choices.LR_SCALINGS,
    (("evaluate",), "--backend"): choices.BACKENDS,
    (("evaluate",), "--strategy"): choices.STRATEGIES,
    (("predict",), "--task"): choices.TASKS,
    (("predict",), "--format"): choices.PREDICTION_FORMATS,
    (("export",), "--format"): choices.EXPORT_FORMATS,
    (("synth",), "--kind"): choices.DATA_KINDS,
    (("synth",), "--dtype"): choices.DTYPES,
    (("launch", "k8s"), "--kind"): choices.K8S_KINDS,
    (("launch", "k8s"), "--mpi-launcher"): choices.MPI_LAUNCHERS,
    (("launch", "horovod"), "--controller"): choices.HOROVOD_CONTROLLERS,
    (("launch", "local"), "--network"): choices.LOCAL_NETWORKS,
}
# `harness tune` takes every flag of `harness train` (the run it tunes)
FLAGS.update({(("tune",), flag): names for (path, flag), names in list(FLAGS.items()) if path == ("train",)})


def _flags_with_choices(parser: argparse.ArgumentParser, path=()):
    """`{(subcommand path, flag): choices}` over the whole parser tree."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_flags_with_choices(sub, path + (name,)))
        elif action.choices is not None:
            found[(path, action.option_strings[-1])] = tuple(action.choices)
    return found


def test_importing_the_choices_loads_no_tensorflow():
    code = ("import sys, harness.choices, harness.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_flag_offers_its_list():
    found = _flags_with_choices(cli.build_parser())
    assert set(found) == set(FLAGS), set(found) ^ set(FLAGS)
    for key, expected in FLAGS.items():
        assert found[key] == expected, key


def test_every_list_is_a_tuple_of_distinct_names_with_a_docstring():
    body = ast.parse(pathlib.Path(choices.__file__).read_text()).body
    documented = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            documented[node.targets[0].id] = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str) and len(after.value.value) > 20
    names = [n for n in vars(choices) if n.isupper()]
    assert len(names) >= 20 and set(names) == set(documented)
    for name in names:
        assert documented[name], f"{name}: no docstring after it"
        value = getattr(choices, name)
        for names_ in (value.values() if isinstance(value, dict) else [value]):
            assert isinstance(names_, tuple) and len(set(names_)) == len(names_) > 0, name
            assert all(isinstance(n, str) for n in names_), name


def test_help_texts_name_every_loss_and_monitor():
    parser = cli.build_parser()
    text = parser._subparsers._group_actions[0].choices["train"].format_help()
    for name in (*choices.LOSSES, *choices.EPOCH_METRICS, *choices.CLASS_WEIGHTS):
        assert name in text, name


# --- the implementations cover exactly the lists --------------------------------------------------------------
def test_tasks_and_kinds_are_the_specs():
    from harness.data.export import records
    from harness.data.spec import dataspec, config as spec_config
    from harness.predict import options

    assert (dataspec.CLASSIFICATION, dataspec.REGRESSION) == choices.TASKS == (options.CLASSIFICATION,
                                                                                options.REGRESSION)
    assert (dataspec.IMAGE, dataspec.TABLE) == choices.DATA_KINDS
    assert (records.FLOAT, records.INT64, records.BYTES) == choices.DTYPES == spec_config.DTYPES
    assert (options.CSV, options.TFRECORD) == choices.PREDICTION_FORMATS
    assert set(choices.TASK_LOSSES) == set(choices.TASK_METRICS) == set(choices.MONITORS) == set(choices.TASKS)


@pytest.mark.parametrize("task", choices.TASKS)
def test_every_loss_of_a_task_is_built_and_distinct(task):
    import tensorflow as tf

    from harness.train.model import losses

    labels = tf.constant([0, 1, 2, 1], tf.int32) if task == "classification" else tf.constant([0.5, -1., 2., 0.])
    logits = tf.constant([[2., .5, -1.], [0., 1., 0.], [.3, .3, 2.], [1., -1., 0.]]) if task == "classification" \
        else tf.constant([[0.], [1.], [1.5], [-0.5]])
    values = {}
    for name in choices.TASK_LOSSES[task]:
        out = losses.make_loss(name, task=task)(labels, logits, None)
        assert out.shape == (4,) and out.dtype == tf.float32, name
        values[name] = tuple(np.round(out.numpy(), 6))
    assert len(set(values.values())) == len(values), values  # no name falls through to another's branch
    other = [n for n in choices.LOSSES if n not in choices.TASK_LOSSES[task]]
    with pytest.raises(ConfigError, match=re.escape(f"--loss must be one of {choices.TASK_LOSSES[task]!r}")):
        losses.make_loss(other[0], task=task)


def test_every_optimizer_is_built_as_its_own_class():
    from harness.train.model import optim
    from harness.train.options import TrainOptions

    built = {name: type(optim.make_optimizer(TrainOptions(data=("x",), optimizer=name), 1e-3)).__name__
             for name in choices.OPTIMIZERS}
    assert {name: cls.lower() for name, cls in built.items()} == {name: name for name in choices.OPTIMIZERS}
    with pytest.raises(ConfigError, match=re.escape(f"optimizer must be one of {choices.OPTIMIZERS!r}, got 'rmsprop'")):
        TrainOptions(data=("x",), optimizer="rmsprop")


def test_every_schedule_has_its_own_curve():
    from harness.train.model import optim

    curves = {kind: tuple(round(optim.ScheduleConfig(peak=1.0, total_steps=10, kind=kind, decay_steps=3,
                                                     decay_rate=0.5).at(step), 12) for step in range(10))
              for kind in choices.SCHEDULES}
    assert len(set(curves.values())) == len(choices.SCHEDULES), curves
    assert curves["constant"] == (1.0,) * 10
    assert curves["cosine"][5] == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


def test_every_scaling_is_distinct():
    from harness.train.model import optim

    peaks = {s: optim.peak_learning_rate(0.1, s, 400, 100) for s in choices.LR_SCALINGS}
    assert peaks == {"none": pytest.approx(0.1), "linear": pytest.approx(0.4), "sqrt": pytest.approx(0.2)}


def test_every_precision_is_a_keras_policy():
    import tf_keras as keras

    from harness.train.model import precision

    for name in choices.PRECISIONS[1:]:
        assert precision.resolve_precision(name) == (name, "requested")
        assert keras.mixed_precision.Policy(name).name == name
    assert choices.PRECISIONS[0] == "auto" and precision.resolve_precision("auto")[0] in choices.PRECISIONS[1:]


def test_strategies_and_backends_are_the_enums_and_classes():
    from harness.distribute import backend, strategy
    from harness.distribute.context import Backend

    assert choices.STRATEGIES == (strategy.AUTO, *(b.value for b in Backend if b is not Backend.HOROVOD))
    assert {backend.TrainingBackend.name, backend.HorovodBackend.name} == set(choices.BACKENDS)
    assert tuple(strategy._COMMUNICATION) == choices.COMMUNICATIONS


@pytest.mark.parametrize("field, value", [("precision", "fp16"), ("strategy", "parameter_server"),
                                          ("cache", "disk"), ("backend", "mpi")])
def test_train_options_refuse_a_name_not_in_the_list(field, value):
    from harness.train.options import TrainOptions

    with pytest.raises(ConfigError, match=f"{field} must be one of .*, got '{value}'"):
        TrainOptions(data=("x",), **{field: value})


def test_every_cache_mode_is_decided(tmp_path):
    from harness.data.input import stages

    kinds = {mode: stages.choose_cache(mode, 1000, cache_dir=str(tmp_path), name="c", available=10**9).kind
             for mode in choices.CACHE_MODES}
    assert kinds == {"auto": "memory", "memory": "memory", "file": "file", "none": "none"}
    with pytest.raises(ConfigError, match="cache must be one of auto, memory, file, none, got 'disk'"):
        stages.choose_cache("disk", 1000, cache_dir=None, name="c")


def test_the_metrics_computed_are_the_metrics_listed():
    from harness.train.model import metrics

    confusion = metrics.from_confusion(np.array([[3, 1], [0, 2]]))
    scalars = {k[4:] for k, v in confusion.items() if isinstance(v, float)}
    lists = {k[4:] for k, v in confusion.items() if isinstance(v, list) and k != "val_confusion_matrix"}
    assert scalars == set(choices.TASK_METRICS["classification"])
    assert lists == set(choices.PER_CLASS_METRICS) == set(metrics.PER_CLASS)
    regression = metrics.from_regression_sums([4, 2.0, 2.0, 4.0, 10.0])
    assert {k[4:] for k in regression} - {"count"} == set(choices.TASK_METRICS["regression"])


@pytest.mark.parametrize("task", choices.TASKS)
def test_every_monitor_is_accepted_and_its_logs_are_written(task, tmp_path):
    from harness.train.lifecycle import early_stopping
    from harness.train.report import tensorboard
    from harness.train.options import TrainOptions

    for monitor in choices.MONITORS[task]:
        early_stopping.check(TrainOptions(data=("x",), validation_data=("y",), monitor=monitor), task)
        assert monitor in tensorboard.SCALARS
    with pytest.raises(ConfigError, match=re.escape(f"choose one of {list(choices.MONITORS[task])!r}")):
        early_stopping.check(TrainOptions(data=("x",), validation_data=("y",), monitor="val_bogus"), task)


def test_launch_tables_cover_the_kinds():
    from harness.launch import k8s, mpi

    assert tuple(k8s.RESTART_POLICIES) == choices.K8S_KINDS == k8s.KINDS
    assert mpi.CONTROLLERS == choices.HOROVOD_CONTROLLERS


def _string_literals(tree):
    """`(line, frozenset of names)` for every list, tuple or set literal of two or more string constants."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            yield node.lineno, frozenset(e.value for e in node.elts)


def test_no_module_writes_a_choice_list_again():
    """A copy of a list (in a `choices=`, a check or an error message) is how two lists drift apart."""
    package = pathlib.Path(cli.__file__).parent
    lists = {}
    for name in (n for n in vars(choices) if n.isupper()):
        value = getattr(choices, name)
        for names in (value.values() if isinstance(value, dict) else [value]):
            if len(names) >= 2:
                lists[frozenset(names)] = name
    copies = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "choices.py":
            continue
        tree = ast.parse(path.read_text())
        copies += [f"{path.relative_to(package)}:{line}: {lists[found]}" for line, found in _string_literals(tree)
                   if found in lists]
        copies += [f"{path.relative_to(package)}:{node.lineno}: choices= literal" for node in ast.walk(tree)
                   if isinstance(node, ast.keyword) and node.arg == "choices"
                   and isinstance(node.value, (ast.List, ast.Tuple, ast.Set))]
    assert copies == []
