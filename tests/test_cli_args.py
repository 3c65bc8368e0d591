"""Command-line arguments: bad counts are one-line usage errors (exit 2), help texts say what a default means,
and synth refuses arguments that would write a broken export."""
import argparse

import pytest

from harness import cli
from harness.data.export import synth
from harness.errors import ConfigError


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage: harness" in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["inspect", "x", "--records", "0"], "argument --records: expected an integer >= 1, got '0'"),
    (["inspect", "x", "--records", "-3"], "argument --records: expected an integer >= 1, got '-3'"),
    (["inspect", "x", "--records", "many"], "argument --records: expected an integer >= 1, got 'many'"),
    (["inspect", "x", "--kernel-margin", "-2"], "argument --kernel-margin: expected an integer >= 0, got '-2'"),
    (["synth", "out", "--patch-size", "0"], "argument --patch-size: expected an integer >= 1, got '0'"),
    (["synth", "out", "--kernel-size", "-2"], "argument --kernel-size: expected an integer >= 0, got '-2'"),
    (["synth", "out", "--shards", "0"], "argument --shards: expected an integer >= 1, got '0'"),
    (["synth", "out", "--records", "-1"], "argument --records: expected an integer >= 1, got '-1'"),
    (["synth", "out", "--classes", "0"], "argument --classes: expected an integer >= 1, got '0'"),
    (["bench", "input", "--data", "x", "--batch", "0"], "argument --batch: expected an integer >= 1, got '0'"),
    (["bench", "input", "--data", "x", "--repeats", "0"], "argument --repeats: expected an integer >= 1, got '0'"),
    (["bench", "train", "--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    (["bench", "train", "--warmup", "-1"], "argument --warmup: expected an integer >= 0, got '-1'"),
    (["train", "--data", "x", "--shuffle-buffer", "0"], "argument --shuffle-buffer: expected an integer >= 1, got '0'"),
    (["train", "--data", "x", "--steps-per-loop", "0"],
     "argument --steps-per-loop: expected an integer >= 1, got '0'"),
    (["train", "--data", "x", "--steps-per-loop", "many"],
     "argument --steps-per-loop: expected an integer >= 1, got 'many'"),
    (["demo", "--epochs", "0"], "argument --epochs: expected an integer >= 1, got '0'"),
])
def test_bad_counts_are_usage_errors(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # without the check, synth would write into ./out
    assert _usage_error(capsys, argv).endswith(message)


def test_synth_refuses_an_odd_kernel_size(tmp_path, capsys):
    out = tmp_path / "odd"
    assert cli.main(["synth", str(out), "--records", "2", "--shards", "1", "--patch-size", "4",
                     "--kernel-size", "3"]) == 2
    assert "harness synth: ConfigError: kernel size must be 0, 1 (no margin) or even" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("kwargs, match", [
    ({"patch_size": 0}, "patch size must be >= 1, got 0"),
    ({"kernel_size": -2}, "kernel size must be 0, 1 .* got -2"),
    ({"kernel_size": 3}, "kernel size must be 0, 1 .* got 3"),
    ({"records": 0}, "need records >= shards >= 1"),
    ({"shards": 0}, "need records >= shards >= 1"),
    ({"bands": []}, "non-empty list of band names"),
    ({"bands": "B2"}, "non-empty list of band names"),
    ({"bands": ["a", "landcover"]}, "band and label names must be distinct"),
    ({"classes": 0}, "need classes >= 1"),
    ({"dtype": "double"}, "dtype must be one of float, int64, bytes"),
])
def test_synth_image_refuses_broken_exports(tmp_path, kwargs, match):
    out = tmp_path / "export"
    with pytest.raises(ConfigError, match=match):
        synth.write_image_export(str(out), **{"records": 2, "shards": 1, "patch_size": 4, **kwargs})
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("kwargs, match", [
    ({"records": 0}, "need records >= shards >= 1"),
    ({"bands": ()}, "non-empty list of band names"),
    ({"dtype": "bytes"}, "dtype must be one of float, int64"),
])
def test_synth_table_refuses_broken_exports(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        synth.write_table_export(str(tmp_path / "t"), **kwargs)


def test_synth_kernel_size_one_is_no_margin(tmp_path):
    """Earth Engine's default kernelSize [1, 1] stores exactly P x P."""
    from harness.data.export import records, shards as S

    paths = synth.write_image_export(str(tmp_path), records=2, shards=1, bands=["a"], patch_size=4, kernel_size=1)
    schema = records.schema_of(records.first_examples(S.discover_shards(paths[:1])[0], 1)[0])
    assert schema["a"].length == 16


def _help(command) -> str:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in command:
        parser = sub.choices[name]
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return " ".join(parser.format_help().split())


def test_help_says_what_a_derived_default_is():
    train = _help(["train"])
    assert "default 1024" not in train
    assert "--shuffle-buffer SHUFFLE_BUFFER records; default: about 256 MB of serialized records, at most 16384" in train
    for command in (["inspect"], ["train"], ["synth"], ["bench", "input"], ["bench", "train"], ["reshard"],
                    ["launch", "k8s"], ["launch", "mpi"], ["data-service", "worker"]):
        assert "(default: None)" not in _help(command), command
    assert "--batch BATCH examples per batch (default: 64)" in _help(["bench", "input"])
    assert "kernel size k of the export (stored patch = patchDimensions + k); default: from mixer.json" in \
        _help(["inspect"])


def test_every_option_has_help():
    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from walk(sub, f"{name} {sub_name}")
            elif action.option_strings and not action.help:
                yield f"{name} {action.option_strings[-1]}"

    assert list(walk(cli.build_parser(), "harness")) == []


def test_bench_input_without_label_asks_for_the_flag(tmp_path, capsys):
    synth.write_image_export(str(tmp_path), records=4, shards=1, bands=["a"], label=None, patch_size=4)
    assert cli.main(["bench", "input", "--data", str(tmp_path), "--batch", "2", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "harness bench: SpecError: the spec has no label: give --label NAME" in err
    assert "declare `label:`" not in err


@pytest.mark.parametrize("argv, usage, message", [
    (["train", "--data", "x", "--lable", "class"], "usage: harness train --data EXPORT",
     "harness train: error: unrecognized arguments: --lable class (did you mean --label?)"),
    (["train", "--epoch", "2"], "usage: harness train", "(did you mean --epochs?)"),    # no abbreviation taken
    (["predict", "--model", "m", "--data", "d", "--output", "o", "--probs"], "usage: harness predict",
     "harness predict: error: unrecognized arguments: --probs (did you mean --probabilities?)"),
    (["launch", "local", "--workers", "2", "--timout", "4", "--", "harness", "train", "--anything"],
     "usage: harness launch local", "unrecognized arguments: --timout (did you mean --timeout?)"),
    (["inspect", "x", "--zzz"], "usage: harness inspect", "unrecognized arguments: --zzz (see harness inspect --help)"),
])
def test_an_unknown_flag_gets_its_subcommands_usage_and_the_closest_flag(capsys, argv, usage, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(usage) and err.rstrip().endswith(message), err


def test_train_help_groups_its_flags_by_what_they_decide(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    titles = [line[:-1] for line in out.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert titles == ["options", "data", "distribution", "optimization", "optimizer and schedule", "loss",
                      "training control", "model", "output", "performance", "example"], titles
    options = out.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    assert options.split() == ["-h,", "--help", "show", "this", "help", "message", "and", "exit", "-v,", "--verbose",
                               "debug", "logging,", "and", "the", "traceback", "of", "an", "error"]
    assert out.startswith("usage: harness train --data EXPORT") and len(out.split("\n\n", 1)[0].splitlines()) <= 2


# The sections whose fenced blocks tests run line by line as printed: their commands are the examples --help may
# show.
RUN_BLOCKS = {"README.md": "## Quick start",                                   # tests/test_quickstart.py
              "docs/predictions.md": "## Predictions back to Earth Engine",  # tests/predict/test_readme_roundtrip.py
              "docs/predictions.md#evaluate": "## Scoring a test split",     # tests/evaluate/test_evaluate.py
              "docs/data.md": "## Time series"}                              # tests/train/test_layouts_run.py
# No command of a block run as printed shows these; their pages say how they run.
WITHOUT_EXAMPLE = {"reshard", "data-service dispatcher", "data-service worker", "demo", "tune", "bench input",
                   "bench train", "bench scale", "bench allreduce", "launch mpi", "launch horovod",
                   "launch k8s"}


def _run_commands() -> set:
    import pathlib
    import re

    root, found = pathlib.Path(__file__).resolve().parents[1], set()
    for page, heading in RUN_BLOCKS.items():
        text = (root / page.split("#")[0]).read_text().partition("\n" + heading)[2].split("\n## ", 1)[0]
        blocks = "".join(re.findall(r"^```\n(.*?)^```$", text, re.S | re.M))   # every block of the section
        lines = [re.sub(r"\s+#.*$", "", line) for line in blocks.replace("\\\n", " ").splitlines()]
        found |= {" ".join(line.split()) for line in lines if line.strip()}   # a trailing comment is the shell's
    return found


def _subcommands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _subcommands(sub, (*path, name))
                else:
                    yield " ".join((*path, name)), sub


def test_each_commands_example_is_a_line_the_docs_run_as_printed():
    commands, lacking = _run_commands(), set()
    for name, sub in _subcommands(cli.build_parser()):
        if not sub.epilog:
            lacking.add(name)
            continue
        example = sub.epilog.removeprefix("example:\n  ")
        assert example in commands, (name, example)
        assert example.startswith(f"harness {name} "), (name, example)
        assert "example:\n  " + example in sub.format_help()
    assert lacking == WITHOUT_EXAMPLE


def test_a_newcomers_mistakes_are_answered_with_what_to_do(tmp_path, capsys):
    """An empty folder names what counts as a shard; a model file (.py) given where a trained model goes names
    the two things predict takes and how to make one."""
    from harness import exit_codes

    (tmp_path / "empty").mkdir()
    assert cli.main(["inspect", str(tmp_path / "empty")]) == exit_codes.PERMANENT
    err = capsys.readouterr().err
    assert "holds no TFRecord shards (it is empty): a shard is any other file, as Earth Engine names them " \
           "<prefix>-00000.tfrecord.gz" in err and "Traceback" not in err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("x")
    assert cli.main(["inspect", str(tmp_path / "notes")]) == exit_codes.PERMANENT
    assert "(it holds README.md)" in capsys.readouterr().err
    model = tmp_path / "my_model.py"
    model.write_text("def build(inputs): ...\n")
    assert cli.main(["predict", "--model", str(model), "--data", str(tmp_path), "--output", str(tmp_path / "o")]) \
        == exit_codes.PERMANENT
    err = capsys.readouterr().err
    assert f"--model {model}: a Python file, not a trained model: give a run folder or its model.keras (a model " \
           f"file is trained first: harness train --model {model}:FUNCTION ...)" in err and "h5py" not in err


@pytest.mark.parametrize("argv, verbose", [
    (["-v", "train", "--data", "d"], True), (["train", "-v", "--data", "d"], True),
    (["train", "--data", "d", "--verbose"], True), (["train", "--data", "d"], False),
    (["launch", "-v", "local", "--workers", "2", "--", "harness", "train"], True),
    (["launch", "local", "--workers", "2", "--", "harness", "train", "-v"], False),   # the workers' flag, not ours
    (["bench", "input", "-v", "--data", "d"], True), (["data-service", "dispatcher", "-v"], True)])
def test_verbose_is_taken_before_or_after_the_subcommand(argv, verbose):
    """`harness train -v` was refused ("did you mean --verbose?" for --verbose); -v is every command's flag."""
    args, extras = cli.build_parser().parse_known_args(argv)
    assert args.verbose is verbose and not extras


def test_verbose_logging_leaves_out_matplotlibs_font_search():
    import logging

    cli.quiet(True)   # (the root logger's level is pytest's here: basicConfig leaves a configured root alone)
    assert logging.getLogger("matplotlib").getEffectiveLevel() >= logging.WARNING
    assert logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.DEBUG) is False
    assert logging.getLogger("PIL").getEffectiveLevel() >= logging.WARNING
