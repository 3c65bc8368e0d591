"""TrainOptions and the run config (harness/train/options.py): the YAML merged with the flags, flags winning."""
import pytest

from harness.errors import ConfigError
from harness.train.options import TrainOptions, class_weights, load_config, merge_options


def test_flags_win_and_data_keys_go_to_the_spec(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  label: landcover\n  crop_margin: true\ntrain:\n  data: exp\n  epochs: 3\n"
                    "  learning_rate: 0.01\n")
    options, data = merge_options(load_config(str(path)), {"epochs": 7, "bands": ["B2", "B3"]})
    assert (options.data, options.epochs, options.learning_rate) == (("exp",), 7, 0.01)
    assert options.per_replica_batch_size == 32 and options.global_batch_size is None  # the derived default
    assert data == {"label": "landcover", "crop_margin": True, "bands": ["B2", "B3"]}


@pytest.mark.parametrize("text, words", [
    ("train: [1, 2\n", "line 2, column 1: not valid YAML"),
    ("- a\n", "expected a mapping with sections 'data:' and 'train:', got list"),
    ("model: {}\n", "unknown sections ['model']"),
    ("data: 3\n", "section 'data:' must be a mapping"),
])
def test_broken_configs_are_named(tmp_path, text, words):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_config(str(path))


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"unknown train options \['epoch'\]"):
        merge_options({}, {"data": ["x"], "epoch": 3})
    with pytest.raises(ConfigError, match="no training data"):
        merge_options({"train": {"epochs": 2}}, {})
    with pytest.raises(ConfigError, match=r"train.epochs: expected an integer, got '5' \(str\)"):
        TrainOptions(data=("x",), epochs="5")
    with pytest.raises(ConfigError, match="class_weights: expected none, balanced or comma-separated numbers"):
        TrainOptions(data=("x",), class_weights="heavy")


def test_class_weights():
    assert class_weights("none", 3, [0, 1]) is None
    assert class_weights("balanced", 2, [0, 0, 0, 1]) == pytest.approx([4 / 6, 4 / 2])  # n / (classes x count)
    assert class_weights("1,2.5", 2, []) == [1.0, 2.5]
    with pytest.raises(ConfigError, match="has 2 values for 3 classes"):
        class_weights("1,2", 3, [])


def test_steps_per_loop_is_auto_or_a_positive_count(tmp_path):
    assert TrainOptions(data=("x",)).steps_per_loop == "auto" and TrainOptions(data=("x",)).loop_steps is None
    assert TrainOptions(data=("x",), steps_per_loop=16).loop_steps == 16
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  data: exp\n  steps_per_loop: 8\n")
    assert merge_options(load_config(str(path)), {})[0].loop_steps == 8
    for bad in (0, -2, "16", True, 2.5):
        with pytest.raises(ConfigError, match=r"train.steps_per_loop: expected auto or an integer >= 1"):
            TrainOptions(data=("x",), steps_per_loop=bad)
