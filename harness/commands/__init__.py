"""Command-line handlers, one function per `harness` subcommand: each turns the parsed flags into the library's
options objects and calls the library directly. The library itself knows no argparse.

Imports run one way: `harness.cli` → `harness.commands` → `harness.bench` → `harness.train` / `harness.launch` /
`harness.predict` → `harness.data` / `harness.profile` → `harness.distribute` → `harness.errors`. Handlers import
the library inside the function, so `harness --help` does not import TensorFlow.
"""
