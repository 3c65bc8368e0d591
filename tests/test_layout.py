"""The package's imports run one way: cli → commands → bench → train / launch / predict → data / profile →
distribute → errors (issue 10). Read from the source with `ast`, imports inside functions included, so a lazy
import cannot hide an upward one."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "harness"
# A package may import itself and any package of a lower layer, never one of its own layer or above.
LAYERS = [{"errors", "choices", "exit_codes", "redact", "ports", "tracing"}, {"distribute"}, {"data", "profile"},
          {"train", "launch", "predict"}, {"bench"}, {"commands"}, {"cli"}]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            parts = node.module.split(".")
            if len(parts) > 1:
                yield parts[1], node.lineno
            else:  # from harness import X
                yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "harness" and len(parts) > 1:
                    yield parts[1], node.lineno


def test_every_package_has_a_layer():
    packages = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
                if not p.name.startswith("_") and (p.suffix == ".py" or p.is_dir())}
    assert packages == set(LAYER), packages ^ set(LAYER)


def test_no_upward_or_sideways_import():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "__init__.py":
            continue
        mine = rel.parts[0].removesuffix(".py")
        for target, line in _imports(path):
            if target != mine and target in LAYER and LAYER[target] >= LAYER[mine]:
                wrong.append(f"harness/{rel}:{line} imports harness.{target}")
    assert not wrong, "\n".join(wrong)


def test_cli_dispatches_to_functions_not_strings():
    source = (PACKAGE / "cli.py").read_text()
    assert "importlib" not in source and "_target" not in source
    from harness.cli import build_parser
    parser = build_parser()
    for argv in (["inspect", "x"], ["train", "--data", "x"], ["plan", "x", "--global-batch-size", "8"],
                 ["bench", "train"], ["launch", "local", "--workers", "2", "--", "true"]):
        handler = parser.parse_args(argv).handler
        assert callable(handler) and handler.__module__.startswith("harness.commands."), argv


# --- the trainer split (orbit's Controller / StandardTrainer) and its one factory -------------------------------
ROOT = PACKAGE.parent
BUILT_BY_FACTORY = {"Trainer", "Evaluator"}


def _calls(path: pathlib.Path):
    """Names of the classes or functions called in `path`: `Name(...)` and `x.Name(...)`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            yield (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None), node.lineno


def test_train_shows_the_split_in_its_file_names():
    names = {p.name for p in (PACKAGE / "train").iterdir()}
    assert {"trainer.py", "evaluator.py", "controller.py", "factory.py"} <= names
    assert "loop.py" not in names   # the one class doing both jobs is gone


def test_only_the_factory_builds_a_trainer_or_an_evaluator():
    wrong = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path == PACKAGE / "train" / "factory.py":
            continue
        source = path.read_text()
        if "LoopConfig" in source and path != pathlib.Path(__file__).resolve():
            wrong.append(f"{path.relative_to(ROOT)}: LoopConfig")
        wrong += [f"{path.relative_to(ROOT)}:{line}: {name}(...)" for name, line in _calls(path)
                  if name in BUILT_BY_FACTORY]
    assert not wrong, "\n".join(wrong)


def test_benchmarks_and_bench_train_run_the_factory_trainer():
    """Every benchmark that trains, and `harness bench train`, takes its trainer from `harness.train.factory`."""
    users = [p for p in [*(ROOT / "benchmarks").glob("*.py"), PACKAGE / "bench" / "train.py"]
             if "harness.train.controller" in p.read_text() or "Controller(" in p.read_text()]
    assert PACKAGE / "bench" / "train.py" in users and len(users) >= 4, users
    for path in users:
        modules = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        names = {alias.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
                 and node.module == "harness.train" for alias in node.names}
        assert "harness.train.factory" in modules or "factory" in names, path
