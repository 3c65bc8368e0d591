"""What every command's parser shares: the help formatter, the one way a subcommand is added, and the argparse
types of the flags (a bad value is a one-line usage error, exit 2)."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Optional, Sequence


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where it informs: not for None (a value derived or absent, which the help text
    describes instead), not for required options, not where the help already names its default. The description
    and the epilog (the example) keep their line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.required or "default" in text:
            return text
        return super()._get_help_string(action)


def command(sub, name: str, handler: Callable[[argparse.Namespace], int], help: str, *,
            description: Optional[str] = None, example: Optional[str] = None,
            usage: Optional[str] = None) -> argparse.ArgumentParser:
    """Add the subcommand `name` to `sub`: `help` is its line in the command list (and its description unless
    `description` is given), `example` a command line shown under "example:" at the end of its --help (one that
    README.md or docs/ runs as printed: tests/test_cli_help.py), `usage` a short usage line in place of argparse's
    list of every flag. No flag is taken abbreviated (`--epoch` is not `--epochs`)."""
    p = sub.add_parser(name, help=help, description=description or help, formatter_class=HelpFormatter,
                       allow_abbrev=False, usage=usage, epilog=f"example:\n  {example}" if example else None)
    p.set_defaults(handler=handler)
    verbose(p)
    return p


def verbose(parser: argparse.ArgumentParser) -> None:
    """`-v/--verbose` on `parser` too (debug logging, tracebacks), so that `harness train -v` works as `harness -v
    train` does; not given there, it leaves the value the top-level parser set (argparse.SUPPRESS)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging, and the traceback of an error")


def unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str], extras: Sequence[str]) -> None:
    """Answer `extras` (what `parse_known_args` of `argv` left over) with the usage of the subcommand `argv` names
    and the flag closest to the first of them ("did you mean --label?"), exit 2: argparse alone gives the
    top-level usage and no hint."""
    import difflib

    argv = list(argv)
    argv = argv[:argv.index("--")] if "--" in argv else argv
    path, current = [parser], parser
    for token in argv:   # descend through subcommand names (harness launch local ...)
        choices = next((a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if choices and token in choices:
            current = choices[token]
            path.append(current)
    known = sorted({o for p in path for a in p._actions for o in a.option_strings if o.startswith("--")})
    flag = next((t.split("=", 1)[0] for t in extras if t.startswith("-")), None)
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag else []
    current.error(f"unrecognized arguments: {' '.join(extras)}" +
                  (f" (did you mean {close[0]}?)" if close else f" (see {current.prog} --help)"))


def at_least(minimum: int):
    """An argparse `type` for an integer count >= minimum: a bad value is a one-line usage error (exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


POSITIVE, NON_NEGATIVE = at_least(1), at_least(0)


def auto_or_positive(text: str):
    """An argparse `type`: `auto` or an integer >= 1."""
    return "auto" if text == "auto" else POSITIVE(text)


auto_or_positive.__name__ = "auto or integer >= 1"


BYTE_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def byte_sizes(text: str) -> list[int]:
    """An argparse `type`: comma-separated byte counts with an optional K/M/G suffix (powers of 1024), e.g.
    `4096,1M,16M`; a bad one is a usage error (exit 2)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        unit = part[-1:] if part[-1:] in "KMG" else ""
        try:
            value = int(float(part[:len(part) - len(unit)]) * BYTE_UNITS[unit])
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected byte counts such as 4096,1M,16M, got {text!r}") from None
        if value < 4:
            raise argparse.ArgumentTypeError(f"a size must be >= 4 bytes (one float32), got {part!r}")
        sizes.append(value)
    return sizes


def json_object(text: str) -> dict:
    """An argparse `type` for a JSON object (`--model-args '{"depth": 4}'`): anything else is a usage error."""
    import json
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r}")
    return value


json_object.__name__ = "JSON object"


def defaults(options_class) -> dict:
    """`{field: default}` of an options dataclass (fields without a default left out): where a parser's defaults
    and its help's "default X" come from, so the flag and the library agree (`tests/test_layout.py` compares them).
    A field whose default is itself options (`BenchTrainOptions.train`, a `TrainOptions`) gives its fields too, flat
    (the outer class's own fields win)."""
    out, nested = {}, {}
    for f in dataclasses.fields(options_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        if dataclasses.is_dataclass(out.get(f.name)) and not isinstance(out[f.name], type):
            value = out[f.name]
            nested.update({g.name: getattr(value, g.name) for g in dataclasses.fields(value)})
    return {**nested, **out}
