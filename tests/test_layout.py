"""The package's imports run one way: cli → commands → bench / evaluate → train / launch / predict → data /
profile → distribute → model_code → errors (issue 10). Read from the source with `ast`, imports inside functions
included, so a lazy import cannot hide an upward one."""
import ast
import re
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "harness"
# A package may import itself and any package of a lower layer, never one of its own layer or above.
LAYERS = [{"errors", "choices", "exit_codes", "redact", "ports", "tracing", "heavy_imports"}, {"model_code"},
          {"distribute", "keras_kinds", "run_folder"}, {"data", "profile"}, {"train", "launch", "predict"},
          {"bench", "evaluate"}, {"commands"}, {"cli"}]
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


# --- the loop and its one constructor (orbit's Controller / StandardTrainer) -----------------------------------
ROOT = PACKAGE.parent
BUILT_BY_BUILD_RUN = {"Controller", "Trainer", "Evaluator"}


def _calls(path: pathlib.Path):
    """Names of the classes or functions called in `path`: `Name(...)` and `x.Name(...)`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            yield (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None), node.lineno


def test_train_shows_its_jobs_in_its_rooms():
    """`harness/train/` holds the job and its inputs; each of its jobs is a room (issue 42)."""
    rooms = {p.name: {f.name for f in p.glob("*.py")} for p in (PACKAGE / "train").iterdir() if p.is_dir()
             and not p.name.startswith("_")}
    assert set(rooms) == {"loop", "model", "lifecycle", "measure", "report"}, set(rooms)
    assert {"trainer.py", "evaluator.py", "controller.py", "factory.py"} <= rooms["loop"]
    assert {"losses.py", "metrics.py", "optim.py", "precision.py", "builtin.py", "user.py", "parts.py"} <= rooms["model"]
    assert {"backup.py", "resume.py", "preemption.py", "watchdog.py", "peers.py", "guard.py"} <= rooms["lifecycle"]
    top = {p.name for p in (PACKAGE / "train").glob("*.py")}
    assert top == {"__init__.py", "job.py", "options.py", "inputs.py", "demo.py"}, top


def test_data_shows_its_jobs_in_its_rooms():
    """`harness/data/` is four rooms, one per job, and nothing flat beside them (issue 61): an export on disk, the
    feature spec, the input pipeline and its tuning."""
    data = PACKAGE / "data"
    rooms = {p.name: {f.name for f in p.glob("*.py")} for p in data.iterdir() if p.is_dir()
             and not p.name.startswith("_")}
    assert set(rooms) == {"export", "spec", "input", "tune"}, set(rooms)
    assert {"shards.py", "records.py", "index.py", "gcs.py", "source.py", "scan.py", "reshard.py", "synth.py",
            "inspect.py"} <= rooms["export"]
    assert {"dataspec.py", "config.py", "infer.py", "validate.py", "labels.py"} <= rooms["spec"]
    assert {"decode.py", "augment.py", "pipeline.py", "stages.py", "filecache.py", "service.py"} <= rooms["input"]
    assert {"stage_rates.py", "model.py", "levers.py"} <= rooms["tune"]
    top = {p.name for p in data.glob("*.py")}
    assert top == {"__init__.py"}, top


def test_only_build_run_constructs_a_controller_trainer_or_evaluator():
    wrong = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path == PACKAGE / "train" / "loop" / "factory.py":
            continue
        wrong += [f"{path.relative_to(ROOT)}:{line}: {name}(...)" for name, line in _calls(path)
                  if name in BUILT_BY_BUILD_RUN]
    assert not wrong, "\n".join(wrong)


def test_every_loop_user_gets_its_run_from_build_run():
    """Every benchmark that trains, `harness bench train`, the probes and `harness train` build their loop with
    `build_run` (a `Schedule` is what each gives it)."""
    users = [p for p in [*(ROOT / "benchmarks").glob("*.py"), *PACKAGE.rglob("*.py")]
             if "Schedule" in {name for name, _ in _calls(p)} and p.parent.name != "loop"]
    assert {PACKAGE / "bench" / "train.py", PACKAGE / "train" / "job.py",
            PACKAGE / "train" / "measure" / "probe.py"} <= set(users) and len(users) >= 6, users
    for path in users:
        called = {name for name, _ in _calls(path)}
        assert "build_run" in called or "make_run" in called, path
    assert not [p for p in PACKAGE.rglob("*.py") if "per_example_cross_entropy" in p.read_text()]


# --- the run's parts built in one place (Model Garden's `Task`): harness/train/model/parts.py ----------------------
# The builders of a run's model, optimizer, schedule, loss, metrics and precision policy, by their module in
# harness/train/model/. Outside that room (where they are defined, and `parts.py` assembles them) nothing in harness/
# or benchmarks/ calls them, nor builds a Keras optimizer by hand (`<...>.optimizers.Adam(...)`): `harness train`,
# its probe, `harness bench train`, `harness evaluate` and every benchmark take their parts from `RunParts`.
PART_BUILDERS = {"optim": {"make_optimizer", "make_schedule", "schedule_config"},
                 "precision": {"apply_policy", "wrap_optimizer"},
                 "losses": {"make_loss", "resolve", "load_user_loss", "probe"},
                 "builtin": {"builtin_model", "unet", "pixel_classifier"},
                 "user": {"resolve", "ModelBuilder", "builtin"},
                 "metrics": {"for_task"}}
MODEL_ROOM = PACKAGE / "train" / "model"


def _parts_built_by_hand(source: str):
    """`(line, call)` of every call in `source` of a builder of PART_BUILDERS (through its module, however imported
    and named, or imported by name) and of every Keras optimizer built by hand."""
    tree = ast.parse(source)
    modules, names = {}, {}   # local name -> builder module; local name -> builder
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "harness.train.model":
            modules.update({a.asname or a.name: a.name for a in node.names if a.name in PART_BUILDERS})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.train.model."):
            room = node.module.split(".")[3]
            names.update({a.asname or a.name: f"{room}.{a.name}" for a in node.names
                          if a.name in PART_BUILDERS.get(room, ())})
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name.split(".")[3] for a in node.names
                            if a.asname and a.name.startswith("harness.train.model.")
                            and a.name.split(".")[3] in PART_BUILDERS})
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in names:
            yield node.lineno, names[f.id]
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules \
                and f.attr in PART_BUILDERS[modules[f.value.id]]:
            yield node.lineno, f"{modules[f.value.id]}.{f.attr}"
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "optimizers":
            yield node.lineno, f"optimizers.{f.attr} (an optimizer built by hand)"


def test_the_run_parts_are_built_only_in_parts():
    wrong = [f"{path.relative_to(ROOT)}:{line}: {call}(...)"
             for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])
             if MODEL_ROOM not in path.parents for line, call in _parts_built_by_hand(path.read_text())]
    assert not wrong, "\n".join(wrong) + "\n(take them from harness.train.model.parts.RunParts)"
    for text in ("import tf_keras as keras\nkeras.optimizers.Adam(1e-3)",
                 "from harness.train.model import optim, precision\nprecision.wrap_optimizer(optim.make_optimizer(o, 1e-3), p)",
                 "from harness.train.model import losses as l\nl.resolve(o, 'classification')",
                 "from harness.train.model.builtin import unet\nunet(8, 8, 4, 2)",
                 "import harness.train.model.user as u\nu.resolve(o)"):
        assert list(_parts_built_by_hand(text)), text
    assert not list(_parts_built_by_hand("from harness.train.model.parts import RunParts\nRunParts(o).create_optimizer()"))


def test_every_loop_user_takes_its_parts_from_run_parts():
    """Whoever builds a loop (`build_run`, `build_evaluator`) outside harness/train/loop/ takes the model, optimizer
    and loss it gives it from `harness.train.model.parts`."""
    users = [p for p in [*(ROOT / "benchmarks").glob("*.py"), *PACKAGE.rglob("*.py")]
             if {"build_run", "build_evaluator"} & {name for name, _ in _calls(p)} and p.parent.name != "loop"]
    assert {PACKAGE / "bench" / "train.py", PACKAGE / "train" / "job.py", PACKAGE / "evaluate" / "run.py"} <= set(users)
    for path in users:
        assert "harness.train.model.parts" in path.read_text(), path


def test_one_tuner_measures_the_step_and_decides():
    """`harness tune` and `harness train --tune` are one tuner (issue 61): outside harness/data/tune/ (the model and
    the levers, without TensorFlow) only harness/train/measure/tune.py imports the model or the levers, or times
    the step for a decision (`sized_synthetic_probe`); `harness tune` reaches it through `harness.train.job.tune`."""
    tuner = PACKAGE / "train" / "measure" / "tune.py"
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        if (PACKAGE / "data" / "tune") in path.parents or path == tuner:
            continue
        text = path.read_text()
        imports = {f"{node.module}.{a.name}" for node in ast.walk(ast.parse(text, str(path)))
                   if isinstance(node, ast.ImportFrom) and node.module for a in node.names}
        assert not imports & {"harness.data.tune.levers", "harness.data.tune.model"}, path
        assert "sized_synthetic_probe(" not in text or path.name == "probe.py", path
    assert "tune_lib.measure(" in (PACKAGE / "train" / "job.py").read_text()
    assert "job.tune(" in (PACKAGE / "commands" / "tune.py").read_text()


# "Which backend is this?" has one home: harness/distribute/ (the backend's methods, the context's properties).
BACKEND_CHECK = re.compile(r"Backend\.HOROVOD|[=!]= *[\"']horovod[\"']|[\"']horovod[\"'] *[=!]=|backend\.name *[=!]="
                           r"|isinstance\([^)]*HorovodBackend")


def test_which_backend_is_asked_only_in_distribute():
    wrong = [f"harness/{path.relative_to(PACKAGE)}:{i}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "distribute"
             for i, line in enumerate(path.read_text().splitlines(), 1) if BACKEND_CHECK.search(line)]
    assert not wrong, "\n".join(wrong)
    assert BACKEND_CHECK.search('if backend.name == "horovod":') and BACKEND_CHECK.search("c.backend is Backend.HOROVOD")


# Names and numbers with one home: the HARNESS_* variables in harness/distribute/environment.py, the ports the
# harness fixes in harness/ports.py.
CONSTANTS = {"HARNESS_": PACKAGE / "distribute" / "environment.py", "port": PACKAGE / "ports.py"}


def _literals(path: pathlib.Path):
    from harness import ports

    fixed = {ports.TF_SERVER_PORT, ports.DATA_SERVICE_PORT, ports.TENSORBOARD_PORT}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"HARNESS_[A-Z0-9_]+",
                                                                                           node.value):
            yield "HARNESS_", node.value, node.lineno
        elif isinstance(node, ast.Constant) and type(node.value) is int and node.value in fixed:
            yield "port", node.value, node.lineno


def test_variable_names_and_ports_only_in_their_module():
    wrong = [f"harness/{path.relative_to(PACKAGE)}:{line}: {value!r} (its home: {CONSTANTS[kind].name})"
             for path in sorted(PACKAGE.rglob("*.py")) for kind, value, line in _literals(path)
             if path != CONSTANTS[kind]]
    assert not wrong, "\n".join(wrong)


# --- each command's parser beside its handler, its defaults read from the options it fills -----------------------
def _subparser(*names):
    import argparse

    from harness.cli import build_parser

    parser = build_parser()
    for name in names:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def _same(got, want) -> bool:
    """`got` (a parser's default, or the word its help names) is `want` (the dataclass field's default): the same
    value, number or sequence; "none" or None for an empty sequence."""
    if isinstance(want, (list, tuple)):
        return list(got) == list(want) if isinstance(got, (list, tuple)) else (not want and got in (None, "none"))
    if isinstance(got, str) and isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return float(got) == want
        except ValueError:
            return False
    return got == want or (isinstance(got, str) and got == str(want))


def test_parser_defaults_are_the_options_defaults():
    """A flag's default (or the "default X" its help names, where the flag leaves the value to a `--config`) is
    the default of the options dataclass field it fills: one home for each default."""
    import argparse

    from harness.bench.train import BenchTrainOptions
    from harness.commands.args import defaults
    from harness.launch.k8s import K8sOptions
    from harness.predict.options import PredictOptions
    from harness.train.options import TrainOptions

    wrong, compared = [], 0
    for names, options in ((("bench", "train"), BenchTrainOptions), (("predict",), PredictOptions),
                           (("launch", "k8s"), K8sOptions), (("train",), TrainOptions), (("tune",), TrainOptions)):
        fields = defaults(options)
        for action in _subparser(*names)._actions:
            if action.dest not in fields:
                continue
            want = fields[action.dest]
            if action.default is argparse.SUPPRESS:   # the value comes from --config, else the dataclass
                said = re.search(r"\bdefault:? ([^\s;,:)]+)", action.help or "")
                if said is None or want is None:
                    continue
                got = said.group(1)
            else:
                got = action.default
            ok = _same(got, want)
            compared += 1
            if not ok:
                wrong.append(f"harness {' '.join(names)} {action.option_strings[0]}: {got!r}, the options' {want!r}")
    assert not wrong, "\n".join(wrong)
    assert compared >= 60, compared
    assert not _same("1e-2", 0.001) and not _same("auto", "tf") and _same("none", ()) and _same("0", 0.0)


# harness/train's rooms run one way too: the model's parts, then what a run reports, the loop, then the run's life
# and the measuring around the loop (never each other); the job, its options and inputs use any of them.
TRAIN_ROOMS = [{"model"}, {"report"}, {"loop"}, {"lifecycle", "measure"}]
TRAIN_ROOM = {name: i for i, names in enumerate(TRAIN_ROOMS) for name in names}


def test_train_rooms_import_one_way():
    wrong = []
    for path in sorted((PACKAGE / "train").rglob("*.py")):
        rel = path.relative_to(PACKAGE / "train")
        if len(rel.parts) < 2:
            continue   # job, options, inputs, demo
        mine = rel.parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.train."):
                target = node.module.split(".")[2]
                if target != mine and TRAIN_ROOM.get(target, len(TRAIN_ROOMS)) >= TRAIN_ROOM[mine]:
                    wrong.append(f"harness/train/{rel}:{node.lineno} imports harness.train.{target}")
    assert not wrong, "\n".join(wrong)


# --- no import circle, lazy imports included (issue 61) ------------------------------------------------------
def _module_graph() -> dict:
    """harness's modules (dotted names) -> the harness modules each imports, at its top or inside a function:
    `from harness.a import b` is an edge to `harness.a.b` where that is a module, else to `harness.a`."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
        graph[name] = edges & set(modules) - {name}
    return graph


def test_no_import_circle():
    """No two modules import each other, directly or round a longer circle (Tarjan's strongly connected
    components over `_module_graph`): a circle hidden in a function-level import still makes the two modules one
    job that no file shows (distribute/backend <-> horovod and lifecycle/peers <-> storage were the last two)."""
    graph, index, low, stack, on_stack, circles = _module_graph(), {}, {}, [], set(), []

    def visit(v):   # recursive Tarjan: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


# --- docs/development.md's layout map is the code's (issue 61) -------------------------------------------------
def _map_rows() -> dict:
    """docs/development.md's layout table: each `harness/...` row's paths -> the module names its `holds` column
    lists (backticked), e.g. {("harness/train/loop/",): {"trainer", "evaluator", ...}}."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`harness/"):
            rows[tuple(re.findall(r"`([^`]+)`", cells[0]))] = set(re.findall(r"`([^`]+)`", cells[1]))
    return rows


def test_the_layout_map_lists_every_module_where_it_is():
    """Every folder of harness/ has a row that lists exactly its modules (no module missing, none that is gone);
    every module at harness/'s top is a row of its own (or shares one: `harness/errors.py`, `harness/exit_codes.py`)."""
    rows = _map_rows()
    folders = {f"{p.relative_to(ROOT).as_posix()}/": {m.stem for m in p.glob("*.py") if m.name != "__init__.py"}
               for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists() and p != PACKAGE}
    mapped = {paths[0]: held for paths, held in rows.items() if paths[0].endswith("/")}
    assert set(mapped) == set(folders), {"no row": sorted(set(folders) - set(mapped)),
                                         "no folder": sorted(set(mapped) - set(folders))}
    wrong = {folder: {"missing": sorted(folders[folder] - held), "gone": sorted(held - folders[folder])}
             for folder, held in mapped.items() if held != folders[folder]}
    assert not wrong, wrong
    top = {f"harness/{p.name}" for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    files = {path for paths in rows for path in paths if path.endswith(".py")}
    assert files == top, {"no row": sorted(top - files), "gone": sorted(files - top)}

# --- harness/predict/: one module per job, the map formats in one of them (issue 61) -----------------------------
PREDICT = PACKAGE / "predict"
MAPS = PREDICT / "maps.py"
# The libraries that read or write a raster or image file (GDAL through rasterio or osgeo, Pillow, imageio,
# tifffile, rio-cogeo): imported, even lazily, by harness/predict/maps.py only.
MAP_LIBRARIES = {"rasterio", "osgeo", "PIL", "imageio", "tifffile", "rio_cogeo"}
# The calls that write a figure or an image (matplotlib's savefig and imsave, an image library's imwrite, a
# colour table, TensorFlow's PNG/JPEG encoders): in maps.py, or in the three modules that draw charts (not maps).
IMAGE_WRITES = {"savefig", "imsave", "imwrite", "write_colormap", "encode_png", "encode_jpeg"}
CHARTS = {PACKAGE / "profile" / "plot.py", PACKAGE / "train" / "report" / "page.py", PACKAGE / "bench" / "scale.py"}


def _map_writes(tree: ast.AST):
    """(what, line) of each import of a map library and each call that writes a figure or an image in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names
                        if alias.name.split(".")[0] in MAP_LIBRARIES)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MAP_LIBRARIES:
            yield node.module, node.lineno
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in IMAGE_WRITES:
                yield f"{name}(...)", node.lineno


def test_predict_shows_its_jobs_in_its_modules():
    """`harness/predict/`: the flow (`job`), what the model is fed (`reader`), the model, the stream, the files and
    the output folder (`writer`), the maps, the uploads, `inspect`'s view, the options; `harness export`'s
    serving and vertex. No test reader in production code (tests/predict_support.py holds it)."""
    found = {p.name for p in PREDICT.glob("*.py")}
    assert found == {"__init__.py", "job.py", "options.py", "reader.py", "model.py", "stream.py", "writer.py",
                     "maps.py", "upload.py", "identity.py", "describe.py", "serving.py", "vertex.py"}, found
    assert not [p for p in PREDICT.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert not [p for p in PREDICT.glob("*.py") if "def read_outputs(" in p.read_text()]


def test_map_formats_live_in_one_module():
    """Every GeoTIFF/COG and PNG written or read by harness/ is in harness/predict/maps.py: a new map format
    touches that module (and the help and docs that name it), nothing else."""
    wrong = [f"harness/{path.relative_to(PACKAGE)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
             if path != MAPS for what, line in _map_writes(ast.parse(path.read_text(), str(path)))
             if not (what.endswith("(...)") and what != "write_colormap(...)" and path in CHARTS)]
    assert not wrong, "\n".join(wrong)
    # the rule sees what it guards: the writes where they are, and a writer added elsewhere
    here = {what for what, _ in _map_writes(ast.parse(MAPS.read_text()))}
    assert {"rasterio", "rasterio.shutil", "savefig(...)", "write_colormap(...)"} <= here, here
    added = ("import rasterio\nrasterio.open(p, 'w', driver='GTiff')\nfrom PIL import Image\n"
             "Image.fromarray(a).save('m.png')\nfig.savefig('m.png')\ntf.io.encode_png(x)\n")
    assert [w for w, _ in _map_writes(ast.parse(added))] == ["rasterio", "PIL", "savefig(...)", "encode_png(...)"]
