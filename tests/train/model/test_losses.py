"""Losses (`harness.train.model.losses`): per example, reduced by the global batch, so the first step's loss on 2
replicas equals one device's; regularization counted once on 1-4 replicas; a scalar user loss refused."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness import keras_kinds
from harness.data.spec.labels import IGNORED
from harness.errors import ConfigError, UserCodeError
from harness.train.model import losses, builtin
from loop_support import build as build_run
import procs
from harness.train.options import TrainOptions

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"
EXAMPLES = ROOT / "examples"


def _first_step_loss(strategy, build, weights, x, y, loss_fn):
    with strategy.scope():
        model = build()
        model.set_weights(weights)
        opt = keras.optimizers.SGD(0.1)
    trainer = build_run(strategy, model, opt, global_batch_size=len(x), loss_fn=loss_fn)
    ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)))
    return trainer.train_step(next(iter(ds)))


def _stock(reduction):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    return losses.make_loss("stock", user_fn=loss.call)


LOSSES = {
    "crossentropy": losses.make_loss("crossentropy"),
    "focal": losses.make_loss("focal", focal_gamma=2.0),
    "dice": losses.make_loss("dice"),
    "crossentropy+dice": losses.make_loss("crossentropy+dice"),
    "custom per-example": losses.make_loss("x", user_fn=losses.load_user_loss(
        f"{EXAMPLES}/losses.py:smoothed_crossentropy")),
    "tf_keras loss, reduction sum": _stock("sum"),
    "tf_keras loss, reduction sum_over_batch_size": _stock("sum_over_batch_size"),
    "crossentropy, nodata": losses.make_loss("crossentropy", ignore=True),
    "crossentropy+dice, nodata": losses.make_loss("crossentropy+dice", ignore=True),
}


@pytest.mark.parametrize("kind", ["table", "image"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_first_step_loss_on_two_replicas_equals_one_device(cpu_mirrored, kind, name):
    rng = np.random.default_rng(3)
    if kind == "table":
        x, y = rng.normal(size=(16, 3)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)
        def build():
            return builtin.pixel_classifier(3, 3, hidden=(8,), mean=[0.0] * 3, variance=[1.0] * 3)
    else:
        x, y = rng.normal(size=(4, 8, 8, 2)).astype(np.float32), rng.integers(0, 3, (4, 8, 8)).astype(np.int32)
        def build():  # no BatchNormalization: its batch statistics are per replica (not a loss question)
            x = inputs = keras.Input((8, 8, 2))
            x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(x)
            return keras.Model(inputs, keras.layers.Conv2D(3, 1, dtype="float32")(x))
    if "nodata" in name:  # a third of the labels (pixels) are nodata, delivered as IGNORED
        y.reshape(-1)[::3] = IGNORED
    reference = build()
    # The closed form: the mean over the whole batch of each example's loss (pixels averaged per example).
    expected = float(tf.reduce_mean(LOSSES[name](tf.constant(y), reference(x, training=True), None)))
    one = _first_step_loss(tf.distribute.OneDeviceStrategy("/cpu:0"), build, reference.get_weights(), x, y,
                           LOSSES[name])
    two = _first_step_loss(cpu_mirrored, build, reference.get_weights(), x, y, LOSSES[name])
    assert abs(one - expected) <= 1e-6 * max(1.0, abs(expected)), (one, expected)
    assert abs(two - one) <= 1e-6, (two, one)


def test_builtin_losses_closed_forms():
    labels = tf.constant([0, 1])
    logits = tf.constant([[2.0, 0.0], [0.0, 0.0]])
    ce = np.array([np.log(1 + np.exp(-2.0)), np.log(2.0)])
    np.testing.assert_allclose(losses.make_loss("crossentropy")(labels, logits, None), ce, rtol=1e-6)
    p = np.exp(-ce)
    np.testing.assert_allclose(losses.make_loss("focal", focal_gamma=2.0)(labels, logits, None), (1 - p) ** 2 * ce,
                               rtol=1e-5)
    np.testing.assert_allclose(losses.make_loss("crossentropy")(labels, logits, tf.constant([2.0, 0.5])),
                               ce * [2.0, 0.5], rtol=1e-6)
    # Dice of one pixel per example, smooth 1: class c ratio (2 p_c y_c + 1) / (p_c + y_c + 1).
    probs = np.exp([[2.0, 0.0], [0.0, 0.0]]) / np.exp([[2.0, 0.0], [0.0, 0.0]]).sum(1, keepdims=True)
    onehot = np.eye(2)[[0, 1]]
    want = 1 - ((2 * probs * onehot + 1) / (probs + onehot + 1)).mean(1)
    np.testing.assert_allclose(losses.dice(labels, logits), want, rtol=1e-6)


def _loss_and_grads(fn, labels, logits):
    logits = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(fn(tf.constant(labels), logits, None))  # summed / global batch, as the loop does
    return float(loss), tape.gradient(loss, logits).numpy()


@pytest.mark.parametrize("name, task, scale", [("crossentropy", "classification", 2.0),
                                               ("focal", "classification", 2.0),
                                               ("dice", "classification", 1.0),
                                               ("mse", "regression", 2.0), ("mae", "regression", 2.0)])
def test_nodata_half_gives_the_valid_half_alone(name, task, scale):
    """Patches whose right half is nodata: the loss and the gradients of the valid half are those of the left half
    alone, scaled by valid / all pixels (1/2; Keras sample-weight semantics, the divisor stays the global pixel
    count) for per-pixel losses, equal for Dice (a ratio over each example's valid pixels); the ignored pixels get
    no gradient, whatever their logits."""
    rng = np.random.default_rng(7)
    classes = 3 if task == "classification" else 1
    logits = rng.normal(size=(4, 6, 8, classes)).astype(np.float32)
    if task == "classification":
        labels = rng.integers(0, 3, (4, 6, 8)).astype(np.int32)
        nodata = IGNORED
    else:
        labels = rng.normal(size=(4, 6, 8)).astype(np.float32)
        nodata = np.nan
    fn = losses.make_loss(name, task=task, ignore=True)
    half_loss, half_grads = _loss_and_grads(fn, labels[:, :, :4], logits[:, :, :4])
    masked = labels.copy()
    masked[:, :, 4:] = nodata
    loss, grads = _loss_and_grads(fn, masked, logits)
    assert loss * scale == pytest.approx(half_loss, rel=1e-6)
    np.testing.assert_allclose(grads[:, :, :4] * scale, half_grads, rtol=1e-5, atol=1e-8)
    assert not grads[:, :, 4:].any()
    scrambled = logits.copy()
    scrambled[:, :, 4:] = 100 * rng.normal(size=scrambled[:, :, 4:].shape)
    assert _loss_and_grads(fn, masked, scrambled)[0] == pytest.approx(loss, rel=1e-6)
    # Without ignore the nodata value is a label like any other: a NaN regression label gives a NaN loss.
    if task == "regression":
        assert np.isnan(_loss_and_grads(losses.make_loss(name, task=task), masked, logits)[0])


def test_nodata_with_a_per_example_user_loss_is_refused(tmp_path):
    fn = losses.make_loss("f.py:f", user_fn=lambda labels, logits: tf.reduce_mean(logits, axis=[1, 2, 3]),
                          ignore=True)
    with pytest.raises(UserCodeError, match=r"--loss f.py:f returns one value per example \(2,\) for labels "
                                            r"\(2, 4, 4\): with ignore_label return the loss of every pixel"):
        losses.probe(fn, (4, 4), 3)
    per_pixel = losses.make_loss("g", user_fn=lambda labels, logits: tf.reduce_sum(logits, -1), ignore=True)
    out = per_pixel(tf.constant([[0, IGNORED]]), tf.ones([1, 2, 3]), None)
    np.testing.assert_allclose(out, [3.0 / 2])  # the ignored pixel weighs 0, the divisor stays 2 pixels


def test_losses_of_the_other_task_are_refused():
    with pytest.raises(ConfigError, match=r"--loss must be one of \('mse', 'mae'\) for task regression or "
                                          r"MODULE:FUNCTION, got 'crossentropy'"):
        losses.resolve(TrainOptions(data=("x",), loss="crossentropy"), "regression")
    with pytest.raises(ConfigError, match="--class-weights balanced weighs classes; task regression has none"):
        losses.resolve(TrainOptions(data=("x",), class_weights="balanced"), "regression")
    mse = losses.resolve(TrainOptions(data=("x",)), "regression")  # the default for regression
    np.testing.assert_allclose(mse(tf.constant([1.0, 2.0]), tf.constant([[0.0], [4.0]]), None), [1.0, 4.0])


def _l2_expected(clip_norm=None):
    """What tests/train/scripts/l2_step.py must print: loss and weights after one SGD step (lr 0.1) of Dense(2)
    with L2(0.5) on the whole batch of 12, w1 = w0 − 0.1 · clip(∇ mean CE + 2·0.5·w0)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)).astype(np.float32), rng.integers(0, 2, 12).astype(np.int32)
    kernel = tf.Variable(rng.normal(size=(3, 2)).astype(np.float32))
    bias = tf.Variable(np.zeros(2, np.float32))
    with tf.GradientTape() as tape:
        ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, x @ kernel + bias))
        loss = ce + 0.5 * tf.reduce_sum(kernel ** 2)
    grads = tape.gradient(loss, [kernel, bias])
    if clip_norm is not None:
        assert float(tf.linalg.global_norm(grads)) > clip_norm  # the clip is active
        grads = tf.clip_by_global_norm(grads, clip_norm)[0]
    return float(loss), [kernel.numpy() - 0.1 * grads[0].numpy(), bias.numpy() - 0.1 * grads[1].numpy()]


def _l2_step(launcher, *runs) -> list[dict]:
    """Every run of `runs` (`REPLICAS[:CLIP]` or `horovod[:CLIP]`) in one launch of l2_step.py: its L2_STEP lines."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run([*launcher, sys.executable, str(SCRIPTS / "l2_step.py"), *map(str, runs)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return [json.loads(part.split("\n")[0]) for part in out.stdout.split("L2_STEP ")[1:]]


def _check_step(results, expected, what):
    loss, weights = expected
    assert results, what
    for r in results:
        assert r["loss"] == pytest.approx(loss, rel=1e-6), what
        for e, got in zip(weights, r["weights"]):
            np.testing.assert_allclose(got, e, rtol=1e-6, atol=1e-7, err_msg=what)


def test_regularization_counted_once_on_1_2_3_4_replicas():
    """One SGD step with an L2 layer gives the same weights on 1, 2, 3 and 4 replicas, for a tf-keras model and a
    Keras 3 one (one process runs every replica count, both kinds each); counted once per replica
    (not scaled by 1/replicas) the regularizer's gradient would be subtracted N times."""
    results = _l2_step([], 1, 2, 3, 4, "2:0.5")
    assert [(r["replicas"], r["clip"], r["kind"]) for r in results] == [
        (n, clip, kind) for n, clip in ((1, None), (2, None), (3, None), (4, None), (2, 0.5))
        for kind in ("tf_keras", "keras3")]
    for n in (1, 2, 3, 4):
        _check_step([r for r in results if (r["replicas"], r["clip"]) == (n, None)], _l2_expected(),
                    f"{n} replicas")
    _check_step([r for r in results if r["clip"] == 0.5], _l2_expected(0.5), "2 replicas, clip 0.5")


def test_regularization_and_clip_on_two_horovod_ranks():
    """The same step on 2 Horovod ranks (6 rows each), both kinds: the same loss and weights on both, with and
    without --clip-norm (clipped after the tape's average); one horovodrun runs both."""
    horovodrun = [*procs.HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo"]
    results = _l2_step(horovodrun, "horovod", "horovod:0.5")
    for clip in (None, 0.5):
        mine = [r for r in results if r["clip"] == clip]
        assert sorted((r["kind"], r["rank"]) for r in mine) == [(k, i) for k in ("keras3", "tf_keras")
                                                                 for i in (0, 1)]
        assert {r["replicas"] for r in mine} == {2}
        _check_step(mine, _l2_expected(clip), f"2 Horovod ranks, clip {clip}")


def _write(tmp_path, text):
    path = tmp_path / "user_loss.py"
    path.write_text(text)
    return str(path)


def test_scalar_user_loss_is_refused_with_the_explanation(tmp_path):
    path = _write(tmp_path, "import tensorflow as tf\n\ndef mean_ce(labels, logits):\n    return tf.reduce_mean("
                            "tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))\n")
    fn = losses.resolve(TrainOptions(data=("x",), loss=f"{path}:mean_ce"))
    with pytest.raises(UserCodeError) as e:
        losses.probe(fn, (), 3)
    text = str(e.value)
    assert text.startswith(f"--loss {path}:mean_ce returns a scalar; return the loss of every example, shape [batch]")
    assert "divides by the global batch" in text and "one replica's share" in text
    with pytest.raises(UserCodeError, match=r"returns shape \(2, 4\) for labels \(2, 4, 4\): expected \[batch\] or "):
        losses.probe(losses.make_loss("f", user_fn=lambda labels, logits: tf.reduce_mean(logits, axis=[2, 3])),
                     (4, 4), 3)


def test_loss_refusals(tmp_path):
    with pytest.raises(ConfigError, match="--loss must be one of .* or MODULE:FUNCTION, got 'hinge'"):
        losses.resolve(TrainOptions(data=("x",), loss="hinge"))
    path = _write(tmp_path, "def f(labels, logits):\n    return logits[:, 0]\n")
    with pytest.raises(ConfigError, match=f"--class-weights balanced weighs the built-in losses; weigh the classes "
                                          f"inside your loss {path}:f"):
        losses.resolve(TrainOptions(data=("x",), loss=f"{path}:f", class_weights="balanced"))
    # A Keras 3 loss object is taken (its unreduced call) and refused by name with a model of the other kind
    k3 = _write(tmp_path, "import keras\nloss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)\n")
    loss_fn = losses.resolve(TrainOptions(data=("x",), loss=f"{k3}:loss"))
    logits, labels = tf.constant([[2.0, 0.0], [0.0, 1.0]]), tf.constant([0, 0])
    np.testing.assert_allclose(loss_fn(labels, logits, None),
                               tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits), rtol=1e-6)
    keras_kinds.check_same(keras_kinds.KERAS3, loss_fn.keras_object, "--loss k3")
    with pytest.raises(UserCodeError, match=r"--loss k3 is Keras 3 \(`import keras`\); the model is tf-keras .*"
                                            r"write it with `import tf_keras`"):
        keras_kinds.check_same(keras_kinds.TF_KERAS, loss_fn.keras_object, "--loss k3")
    with pytest.raises(UserCodeError, match="cannot import module 'no_such_module_xyz': ModuleNotFoundError"):
        losses.resolve(TrainOptions(data=("x",), loss="no_such_module_xyz:f"))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_user_loss_gets_float32_logits_under_a_mixed_policy(dtype):
    seen = []

    def record(labels, logits):
        seen.append((labels.dtype, logits.dtype))
        return tf.reduce_sum(logits, axis=-1)
    fn = losses.make_loss("record", user_fn=record)
    out = fn(tf.constant([0, 1]), tf.constant([[1.0, 2.0], [3.0, 4.0]], dtype), None)
    assert seen == [(tf.int32, tf.float32)] and out.dtype == tf.float32
    np.testing.assert_array_equal(out, [3.0, 7.0])
    for name in losses.CLASSIFICATION_LOSSES:
        assert losses.make_loss(name)(tf.constant([0, 1]), tf.zeros([2, 2], dtype), None).dtype == tf.float32
    for name in losses.REGRESSION_LOSSES:
        out = losses.make_loss(name, task="regression")(tf.constant([0.5, 1.0]), tf.zeros([2, 1], dtype), None)
        assert out.dtype == tf.float32


def test_float16_logits_of_a_whole_patch_reach_dice_and_iou_as_float32():
    """A 256x256 patch of class 1 predicted right with float16 logits: Dice is 0 to 1e-6 and IoU 1.0. In float16
    the patch's sums (Σp + Σy = 131072) would pass float16's largest value, 65504, and give inf."""
    from harness.train.model.metrics import confusion_counts, from_confusion

    labels = tf.ones([1, 256, 256], tf.int32)
    logits = tf.cast(tf.stack([tf.fill([1, 256, 256], -20.0), tf.fill([1, 256, 256], 20.0)], -1), tf.float16)
    assert float(tf.reduce_sum(tf.cast(tf.ones([256, 256]), tf.float16) * 2)) == float("inf")
    assert abs(float(losses.make_loss("dice")(labels, logits, None)[0])) <= 1e-6
    got = from_confusion(confusion_counts(labels, logits, 2))
    assert got["val_iou"][1] == 1.0 and got["val_mean_iou"] == 1.0 and got["val_accuracy"] == 1.0


def test_a_loss_that_does_not_depend_on_the_logits_is_refused_by_name():
    """A constant (or argmax-based) loss leaves no gradient: refused before the first step, naming --loss, not a
    'No gradients provided' traceback from the optimizer."""
    fn = losses.make_loss("mine.py:flat", user_fn=lambda labels, logits: tf.fill(tf.shape(labels), 1.0))
    with pytest.raises(UserCodeError, match=r"^--loss mine.py:flat does not depend on the logits \(no gradient"):
        losses.probe(fn, (), 3)
    argmax = losses.make_loss("mine.py:hard", user_fn=lambda labels, logits: tf.cast(
        tf.not_equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
    with pytest.raises(UserCodeError, match=r"^--loss mine.py:hard does not depend on the logits"):
        losses.probe(argmax, (4, 4), 3)
    losses.probe(losses.make_loss("crossentropy"), (4, 4), 3)  # the built-ins pass
    losses.probe(losses.make_loss("mse", task="regression"), (), 1, "regression")


# --- a softmax output: its probabilities taken as Keras' from_logits=False takes them (issue 64) -----------------------
USER_MODELS = pathlib.Path(__file__).resolve().parent / "user_models"
MODEL_FILES = {"keras3": USER_MODELS / "keras3_models.py", "tf_keras": USER_MODELS / "tf_keras_models.py"}
FLOOR = float(-np.log(np.e / (np.e + 3)))   # softmax applied to 4 probabilities: the least crossentropy, 0.744


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_the_loss_of_probabilities_is_kerass_crossentropy_from_probabilities(kind):
    """Eager (the probabilities clipped, then their log) and traced on a softmax op (its own logits): Keras'
    SparseCategoricalCrossentropy(from_logits=False) of the same probabilities, a probability of 0 included."""
    import importlib

    stock = importlib.import_module("keras" if kind == "keras3" else "tf_keras").losses.SparseCategoricalCrossentropy(
        from_logits=False, reduction="none")
    loss = losses.of_probabilities(losses.make_loss("crossentropy"))
    labels = tf.constant([0, 1, 2, 3])
    logits = tf.constant([[4.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 30.0]])
    probabilities = tf.nn.softmax(logits)
    eager = loss(labels, probabilities, None)
    np.testing.assert_allclose(eager, stock(labels, probabilities), rtol=1e-6)
    zero = loss(labels, tf.constant([[0.0, 1.0, 0.0, 0.0]] * 4), None)   # the true class's probability 0 for one
    assert np.isfinite(zero).all() and float(zero[0]) == pytest.approx(-np.log(losses.EPSILON), rel=1e-5)
    traced = tf.function(lambda y, z: loss(y, tf.nn.softmax(z), None))(labels, logits)
    np.testing.assert_allclose(traced, losses.make_loss("crossentropy")(labels, logits, None), rtol=1e-6)
    np.testing.assert_allclose(traced, tf.function(lambda y, z: stock(y, tf.nn.softmax(z)))(labels, logits),
                               rtol=1e-6)


def _separable(folder: pathlib.Path, records: int = 64, classes: int = 4) -> None:
    """A table export whose class c has band b{c} near 1 and the others near 0: linearly separable."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    y = np.arange(records) % classes
    x = np.eye(classes, dtype=np.float32)[y] + rng.normal(0, 0.1, (records, classes)).astype(np.float32)
    with tf.io.TFRecordWriter(str(folder / "separable.tfrecord.gz"), "GZIP") as w:
        for row, label in zip(x, y):
            values = {**{f"b{c}": float(v) for c, v in enumerate(row)}, "class": float(label)}
            w.write(tf.train.Example(features=tf.train.Features(feature={
                k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in values.items()})
            ).SerializeToString())


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def softmax_runs(request, tmp_path_factory):
    """The kind's `softmax_output` model (Keras 3: Dense(activation="softmax"); tf-keras: a Softmax layer), 4
    classes, trained in this process on a separable export (64 rows, 4 epochs of 4 steps) twice with the same
    command (`--seed` 0, the default); the first run's stdout."""
    import contextlib
    import dataclasses
    import io

    from harness.train import job

    tmp = tmp_path_factory.mktemp(f"softmax_{request.param}")
    _separable(tmp / "data")
    options = TrainOptions(data=(str(tmp / "data"),), epochs=4, per_replica_batch_size=16, strategy="single",
                           learning_rate=0.05, model=f"{MODEL_FILES[request.param]}:softmax_output",
                           output=str(tmp / "first"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        first = job.run(options, data_config={"label": "class"})
    again = job.run(dataclasses.replace(options, output=str(tmp / "again")), data_config={"label": "class"})
    return dict(kind=request.param, tmp=tmp, first=first, again=again, stdout=out.getvalue())


def test_a_softmax_model_trains_on_its_probabilities_below_the_double_softmax_floor(softmax_runs):
    """With softmax applied again the loss could not go below 0.744 (it stayed at 0.7439 from the 8th epoch on this
    export); on the probabilities, Keras' from_logits=False, it falls toward 0."""
    history = [h["loss"] for h in softmax_runs["first"]["history"]]
    assert len(history) == 4 and history[-1] < FLOOR / 2 and history == sorted(history, reverse=True), history
    origin = f"{MODEL_FILES[softmax_runs['kind']]}:softmax_output"
    assert (f"model {origin}: its last layer 'probabilities' applies softmax: its outputs are probabilities; the loss "
            "takes them as Keras' from_logits=False does, and predict, evaluate and export do not apply softmax "
            "again") in softmax_runs["stdout"]


def test_the_same_command_twice_gives_the_same_losses(softmax_runs):
    """`--seed` (0 by default) seeds the weights too: the same initial model, hence the same losses, to the bit."""
    first, again = ([h["loss"] for h in softmax_runs[run]["history"]] for run in ("first", "again"))
    assert first == again


def test_evaluate_scores_the_probabilities_as_training_did(softmax_runs, tmp_path):
    """`harness evaluate` in this process: val_loss is the crossentropy of the saved model's own probabilities."""
    import importlib

    from predict_support import cli_in_process

    run, data = softmax_runs["tmp"] / "first", softmax_runs["tmp"] / "data"
    cli_in_process("evaluate", "--model", run, "--data", data, "--output", tmp_path)
    metrics = json.loads((tmp_path / "evaluation.json").read_text())["metrics"]
    rows = [tf.train.Example.FromString(raw.numpy()).features.feature
            for raw in tf.data.TFRecordDataset(str(data / "separable.tfrecord.gz"), compression_type="GZIP")]
    x = np.array([[f[f"b{c}"].float_list.value[0] for c in range(4)] for f in rows], np.float32)
    y = np.array([int(f["class"].float_list.value[0]) for f in rows])
    keras_module = importlib.import_module("keras" if softmax_runs["kind"] == "keras3" else "tf_keras")
    p = np.asarray(keras_module.models.load_model(str(run / "model.keras"), compile=False)(x, training=False))
    np.testing.assert_allclose(p.sum(1), 1, rtol=1e-5)   # probabilities, as saved
    np.testing.assert_allclose(metrics["val_loss"], -np.log(p[np.arange(len(y)), y]).mean(), rtol=1e-4)
    assert metrics["val_loss"] < FLOOR / 2 and metrics["val_accuracy"] == 1.0
