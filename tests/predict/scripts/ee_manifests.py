"""Each `earthengine upload ...` line given as a JSON list on stdin, through the Earth Engine CLI's own parser and
manifest builder (earthengine-api's ee/cli/commands.py, offline); prints a JSON list of {"manifest": ...} or
{"error": "Type: message"}, one per line.

Run as its own process, with TensorFlow hidden: importing ee.cli.commands calls
`tensorflow.compat.v1.disable_v2_behavior()` when TensorFlow imports, which would turn off eager execution for
the whole process that imported it (every later test of a pytest run)."""
import argparse
import json
import shlex
import sys

sys.modules["tensorflow"] = None          # ee.cli.commands then skips its TensorFlow part (ImportError)
from ee.cli import commands  # noqa: E402


def manifest(line: str) -> dict:
    words = shlex.split(line)
    if words[:2] != ["earthengine", "upload"]:
        raise ValueError(f"not an upload line: {line}")
    command = {"image": commands.UploadImageCommand, "table": commands.UploadTableCommand}[words[2]]
    parser = argparse.ArgumentParser()
    cmd = command(parser)
    return cmd.manifest_from_args(parser.parse_args(words[3:]))


out = []
for line in json.load(sys.stdin):
    try:
        out.append({"manifest": manifest(line)})
    except Exception as e:  # noqa: BLE001  (the CLI's own refusals: EEException, ValueError)
        out.append({"error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
