#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUTDIR — the profiling layer on one GPU (prepared for an NVIDIA H200, no network).
#
# Runs, with mixed_float16, on a synthetic Earth Engine image export written here (GZIP, 128x128 patches, 8 bands):
#   1. synthetic  harness bench train --data synthetic --like DATA   batches generated on the GPU: compute ceiling
#   2. gzip       harness bench train --data DATA                    the export as Earth Engine writes it
#   3. resharded  harness reshard DATA, then bench train on it       uncompressed shards, more parallel reads
# each with a tf.profiler window, NVML sampling, report.json + timeline.png under OUTDIR/<run>/; then
#   4. fit ratio  benchmarks/fit_ratio.py on DATA: the harness loop against Keras model.fit, same U-Net, precision,
#                 batch and pipeline (fit at steps_per_execution 1 and at the harness's K), FIT_ROUNDS rounds
# then prints and writes OUTDIR/gpu_check.txt and OUTDIR/gpu_check.json: input-stall share, GPU utilization (NVML),
# examples/s, the profiler's input figure, the device's idle share (the profiler's overview page,
# device_idle_time_percent, over the trace window, whose steps run one per call with the batch drawn on the host),
# the gap to the synthetic ceiling and the harness/fit ratio. Budget: under 10 minutes (each run is capped).
#
# What it needs on the GPU machine (Python 3.12, CUDA driver, no network):
#   - TensorFlow 2.18 with GPU support, PREINSTALLED. Its wheels cannot be carried: tensorflow 2.18.1 for cp312 is
#     ~615 MB and its CUDA wheels (nvidia-cudnn-cu12 ~700 MB, nvidia-cublas-cu12 ~400 MB, ...) several GB, far over
#     the 64 MiB that travels with the working tree. Without a GPU-enabled TensorFlow the script stops at once
#     and says so.
#   - the small pure-Python/abi3 wheels below, carried in .whl/ at the repository root (~35 MB), installed with
#     --no-index --no-deps only where the module is missing. Fetch them HERE (a machine with network) with:
#
#       pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#         "tf-keras==2.18.0" "nvidia-ml-py>=12" "psutil>=5.9" "tqdm>=4.66" "pyyaml>=6" \
#         "tensorboard-plugin-profile==2.18.0" gviz-api \
#         "matplotlib>=3.8,<3.11" contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six packaging
#
#     (tf-keras must match the installed TensorFlow's minor version: if the machine has TensorFlow 2.X, download
#     tf-keras==2.X.* instead. matplotlib and its dependencies are only for timeline.png; without them the figures
#     are still measured and printed.)
#   - .whl/ is untracked and not ignored, so it travels with the working tree as it is.
# ALLOW_CPU=1 runs the same steps without a GPU (a rehearsal of the script itself; the figures mean nothing; use
# PRECISION=float32 there: float16 kernels on a CPU are very slow). STEPS, WARMUP, BATCH, RUN_LIMIT: see below.
set -euo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
STEPS=${STEPS:-150}          # timed steps per run
WARMUP=${WARMUP:-15}
BATCH=${BATCH:-64}           # per replica
RUN_LIMIT=${RUN_LIMIT:-120}  # seconds per training run
FIT_STEPS=${FIT_STEPS:-40}   # fit ratio: steps per epoch (3 epochs, the first untimed)
FIT_ROUNDS=${FIT_ROUNDS:-2}
PRECISION=${PRECISION:-mixed_float16}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
export HARNESS_CACHE_DIR="$OUT/.harness-cache"
START=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*"; }

say "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/  GPU: /' \
  || say "nvidia-smi not found"

# --- TensorFlow: must be preinstalled with GPU support ------------------------------------------------------------
if ! TFV=$($PY -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null); then
  cat >&2 <<'MSG'
gpu_check: no TensorFlow importable by this Python. TensorFlow's GPU wheels (~615 MB plus GBs of CUDA wheels) cannot
be carried in the 64 MiB that travels with the repository; install tensorflow[and-cuda]==2.18.1 on this machine
(e.g. from a local wheelhouse: pip install --no-index --find-links /path/to/wheels "tensorflow[and-cuda]==2.18.1")
and run again.
MSG
  exit 2
fi
GPUS=$($PY -c 'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null | tail -1)
say "TensorFlow $TFV sees $GPUS GPU(s)"
if [ "${GPUS:-0}" -lt 1 ] && [ -z "${ALLOW_CPU:-}" ]; then
  echo "gpu_check: TensorFlow $TFV is installed but sees no GPU (a CPU-only build, or CUDA libraries missing):" \
       "install tensorflow[and-cuda]==2.18.1" >&2
  exit 2
fi
case "$TFV" in 2.18.*) ;; *) say "warning: harness is tested with TensorFlow 2.18; found $TFV (tf-keras must match)";; esac

# --- the small dependencies, from .whl/ where missing ------------------------------------------------------------
need=()
for pair in tf_keras:tf-keras pynvml:nvidia-ml-py psutil:psutil tqdm:tqdm yaml:pyyaml \
            tensorboard_plugin_profile:tensorboard-plugin-profile gviz_api:gviz-api matplotlib:matplotlib; do
  mod=${pair%%:*}; pkg=${pair#*:}
  $PY -c "import $mod" 2>/dev/null || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ -d "$HERE/.whl" ]; then
    say "installing from .whl/: ${need[*]}"
    extra=()
    for p in "${need[@]}"; do [ "$p" = matplotlib ] && extra+=(contourpy cycler fonttools kiwisolver pillow \
                                                                pyparsing python-dateutil six packaging); done
    $PY -m pip install -q --user --no-index --no-deps --find-links "$HERE/.whl" "${need[@]}" "${extra[@]}" \
      || $PY -m pip install -q --no-index --no-deps --find-links "$HERE/.whl" "${need[@]}" "${extra[@]}" \
      || say "warning: pip could not install some of: ${need[*]} ${extra[*]}"
  else
    say "warning: missing ${need[*]} and no .whl/ folder (see this script's header)"
  fi
fi
$PY -c "import tf_keras" 2>/dev/null || { echo "gpu_check: tf_keras missing (carry tf-keras in .whl/)" >&2; exit 2; }
$PY -c "import pynvml" 2>/dev/null || say "warning: nvidia-ml-py missing: GPU utilization will read 'no GPU'"

harness() { $PY -m harness.cli "$@"; }

# --- data: a synthetic GEE image export, then its resharded copy --------------------------------------------------
DATA="$OUT/data/gzip"
if [ ! -f "$DATA/export-mixer.json" ]; then
  say "writing the synthetic export (GZIP, 384 patches 128x128x8, 4 shards)"
  harness synth "$DATA" --shards 4 --records 384 --patch-size 128 --bands B1 B2 B3 B4 B5 B6 B7 B8 --classes 4
fi
say "resharding for 1 worker x 16 shards"
harness reshard "$DATA" --output "$OUT/data/resharded" --workers 1 --shards-per-worker 16 > "$OUT/reshard.log" 2>&1
grep -m1 "uncompressed shards" "$OUT/reshard.log"

run() {  # run NAME ARGS...: one profiled training benchmark, capped at RUN_LIMIT seconds
  local name=$1; shift
  say "run $name"
  local first=$((WARMUP + 20 < WARMUP + STEPS ? WARMUP + 20 : WARMUP + 1))
  local last=$((first + 10 < WARMUP + STEPS ? first + 10 : WARMUP + STEPS))
  set +e
  timeout --signal=TERM --kill-after=15 "$RUN_LIMIT" $PY -m harness.cli bench train --precision "$PRECISION" \
      --steps "$STEPS" --warmup "$WARMUP" --per-replica-batch-size "$BATCH" --profile-steps "$first:$last" \
      --output "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  set -e
  grep -v -E '^(W0000|I0000)|absl::InitializeLog|^\t' "$OUT/$name.log" | tail -n 12
  [ $rc -eq 0 ] || say "run $name exited with $rc$([ $rc -eq 124 ] && echo ": over ${RUN_LIMIT}s") (see $OUT/$name.log)"
}
run synthetic --data synthetic --like "$DATA"
run gzip --data "$DATA"
run resharded --data "$OUT/data/resharded"

say "fit ratio: harness loop vs Keras fit, $PRECISION"
set +e
timeout --signal=TERM --kill-after=15 $((2 * RUN_LIMIT)) $PY "$HERE/benchmarks/fit_ratio.py" --data "$DATA" \
    --precision "$PRECISION" --batch "$BATCH" --steps "$FIT_STEPS" --epochs 3 --rounds "$FIT_ROUNDS" \
    --output "$OUT/fit" --json "$OUT/fit_ratio.json" > "$OUT/fit_ratio.log" 2>&1
rc=$?
set -e
grep -E '^(round|harness/fit)' "$OUT/fit_ratio.log" || true
[ $rc -eq 0 ] || say "fit ratio exited with $rc (see $OUT/fit_ratio.log)"

# --- the comparison ---------------------------------------------------------------------------------------------
$PY - "$OUT" <<'PYEOF' | tee "$OUT/gpu_check.txt"
import json, os, sys
out = sys.argv[1]
rows, result = [], {}
for name in ("synthetic", "gzip", "resharded"):
    path = os.path.join(out, name, "report.json")
    if not os.path.exists(path):
        rows.append(f"{name:<10} no report (see {name}.log)")
        continue
    r = json.load(open(path))
    s = r["summary"]
    busy = s["accelerator_busy_share"]
    result[name] = {k: s.get(k) for k in ("examples_per_s", "input_stall_share", "accelerator_busy_share", "gpu",
                                          "cpu_percent", "profiler_input_percent", "profiler_device_idle_percent",
                                          "verdict", "steps")}
    result[name]["advice"] = r["advice"]
    result[name]["traces_missing"] = r.get("traces", {}).get("missing")
    prof, idle = s.get("profiler_input_percent"), s.get("profiler_device_idle_percent")
    rows.append(f"{name:<10} {s['examples_per_s']:>11.1f} {100 * s['input_stall_share']:>11.1f}% "
                f"{'no GPU' if busy is None else f'{100 * busy:.1f}%':>9} "
                f"{'-' if prof is None else f'{prof:.1f}%':>15} "
                f"{'no device' if idle is None else f'{idle:.1f}%':>12}  {s['verdict']}")
print(f"{'run':<10} {'examples/s':>11} {'input stall':>12} {'GPU util':>9} {'profiler input':>15} "
      f"{'device idle':>12}  verdict")
print("\n".join(rows))
if "synthetic" in result:
    ceiling = result["synthetic"]["examples_per_s"]
    for name in ("gzip", "resharded"):
        if name in result:
            rate = result[name]["examples_per_s"]
            result[name]["share_of_ceiling"] = rate / ceiling
            print(f"{name}: {rate / ceiling:.0%} of the synthetic ceiling ({ceiling:.1f} examples/s)")
if "gzip" in result and "resharded" in result:
    print(f"reshard gain: {result['resharded']['examples_per_s'] / result['gzip']['examples_per_s']:.2f}x examples/s")
fit_path = os.path.join(out, "fit_ratio.json")
if os.path.exists(fit_path):
    fit = result["fit_ratio"] = json.load(open(fit_path))
    print(f"harness/fit ratio ({fit['model']}, {fit['precision']}, batch {fit['global_batch']}): "
          f"{fit['ratio_fit_spe1']:.2f} vs steps_per_execution 1, {fit['ratio_fit_speK']:.2f} vs "
          f"steps_per_execution {fit['steps_per_loop']}")
else:
    print("harness/fit ratio: not measured (see fit_ratio.log)")
print("device idle: the profiler's device_idle_time_percent over each run's trace window (one host-fed step per "
      "call there); 'no device' on a CPU-only run")
gpu = next((v["gpu"] for v in result.values() if isinstance(v, dict) and "gpu" in v), "?")
print(f"GPU: {gpu}")
json.dump(result, open(os.path.join(out, "gpu_check.json"), "w"), indent=1)
PYEOF
say "done: $OUT/gpu_check.txt, $OUT/gpu_check.json, $OUT/fit_ratio.json, reports and plots under $OUT/{synthetic,gzip,resharded}/"
