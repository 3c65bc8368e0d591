"""Count the calls a run makes to the data layer's once-per-run functions (a spy on every module that binds them).

`install()` wraps discover_shards, find_mixer, record_stats, validate_spec and assign_nonempty wherever the
harness imported them by name, and returns the Counter the wrappers add to; worker scripts print it."""
import collections
import importlib

# function -> modules that hold it as an attribute (defining module first)
TARGETS = {
    "discover_shards": ["harness.data.export.shards", "harness.data.export.source"],
    "find_mixer": ["harness.data.export.shards", "harness.data.export.source"],
    "record_stats": ["harness.data.export.index"],
    "validate_spec": ["harness.data.spec.validate", "harness.data.input.pipeline"],
    "assign_nonempty": ["harness.distribute.sharding", "harness.distribute.plan", "harness.data.input.pipeline"],
}


def install() -> collections.Counter:
    counts = collections.Counter()
    for name, modules in TARGETS.items():
        original = getattr(importlib.import_module(modules[0]), name)

        def spy(*args, _name=name, _fn=original, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        for module in modules:
            setattr(importlib.import_module(module), name, spy)
    return counts
