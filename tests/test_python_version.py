"""Every Python file of the repository compiles on the oldest Python that setup.cfg's `python_requires` allows
(issue 19, item 9: benchmarks/reshard.py nested double quotes in an f-string, which only 3.12 accepts, and
`make bench` stopped there on 3.11). The check runs when the interpreter is that oldest version, as in CI and
`make test` here; on any other it is skipped with the reason."""
import configparser
import pathlib
import sys

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "benchmarks", "tests", "launch", "tools", "examples")


def oldest_supported() -> Version:
    """The lower bound of setup.cfg's `python_requires` (a `>=X.Y` clause), as a Version.

    Raises:
      AssertionError: when python_requires has no `>=` clause (then no oldest version is stated).
    """
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    spec = SpecifierSet(cfg["options"]["python_requires"])
    lows = [Version(s.version) for s in spec if s.operator == ">="]
    assert lows, f"setup.cfg python_requires {spec} states no lower bound (>=X.Y)"
    return max(lows)


def python_files() -> list[pathlib.Path]:
    """The .py files under FOLDERS and at the root, outside virtual environments and caches."""
    found = list(ROOT.glob("*.py"))
    for folder in FOLDERS:
        found += (p for p in (ROOT / folder).rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts))
    return sorted(found)


def test_python_requires_matches_the_readme():
    oldest = oldest_supported()
    readme = (ROOT / "README.md").read_text()
    assert f"Python {oldest.major}.{oldest.minor}" in readme, f"README.md does not state Python {oldest}"


def test_every_file_compiles_on_the_oldest_supported_python():
    oldest = oldest_supported()
    running = Version(f"{sys.version_info.major}.{sys.version_info.minor}")
    if running != Version(f"{oldest.major}.{oldest.minor}"):
        pytest.skip(f"this is Python {running}; the check needs {oldest.major}.{oldest.minor}, the oldest that "
                    f"setup.cfg's python_requires allows")
    files = python_files()
    assert len(files) > 50 and ROOT / "benchmarks" / "reshard.py" in files
    failed = []
    for path in files:
        try:
            compile(path.read_text(), str(path), "exec", dont_inherit=True)
        except SyntaxError as e:
            failed.append(f"{path.relative_to(ROOT)}:{e.lineno}: {e.msg}")
    assert not failed, f"SyntaxError on Python {running}:\n" + "\n".join(failed)
