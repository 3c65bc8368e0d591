#!/usr/bin/env bash
# Install Horovod (with TensorFlow ops, MPI and Gloo controllers) and mpi4py into VENV.
#   tools/install_horovod.sh VENV
# Called by tools/install.sh (so by `make install`, CI and the Docker image alike). TensorFlow must already be in VENV.
#
# Horovod 0.28.1 is its last release and ships no wheels: it is built from the PyPI sdist against the TensorFlow
# in VENV (a C++ extension tied to that TF's ABI) and the Debian OpenMPI (openmpi-bin, libopenmpi-dev; installed
# by tools/install.sh). Steps, each skipped when already done:
#   1. skip everything if VENV's `horovod.tensorflow` imports, is HVD_VERSION, has MPI and Gloo built, and was built
#      for VENV's TF version (stamp $VENV/.horovod-build-key);
#   2. else install the wheel cached under $HARNESS_WHEEL_CACHE (default ~/.cache/harness/wheels, outside the
#      clone so that a fresh clone or a new venv on the same machine reuses it), keyed by
#      horovod version + TF version + Python version + cpu/gpu;
#   3. else build that wheel (`pip wheel --no-deps --no-build-isolation`, 2-3 min on 2 cores) into the cache.
#
# Compatibility patch (only applied for TF >= 2.19; TF 2.15-2.18, our range, build the sdist as it is):
#   horovod/tensorflow/xla_mpi_ops.cc holds Horovod's optional XLA ops (used only with HOROVOD_ENABLE_XLA_OPS=1).
#   Its body is GPU-only, but under `#if TENSORFLOW_VERSION >= 2006000000` it includes XLA headers on CPU builds
#   too, and those headers moved/changed in TF 2.19+, so the build fails there. We compile the file's contents out
#   entirely for TF >= 2.19 (`&& HAVE_GPU && TENSORFLOW_VERSION < 2019000000`), which holds on GPU images as well
#   (a bare `&& HAVE_GPU` guard would still compile the broken includes where HAVE_GPU=1). The patched sdist is
#   re-packed into a tarball and the wheel built from that (an unpacked folder can carry a stale build/ cache).
# Build flags: setup.py always configures CMake as RelWithDebInfo (`-O3 -g` after its CMakeLists.txt), and the
#   debug info is about a third of the compile (cc1plus emits and writes it for every Gloo and Horovod unit) and
#   most of the wheel (16 MB with it). The sdist is built without `-g` (-O3 kept; symbols stay in .dynsym, so a
#   crash's backtrace still names the functions): measured in docs/development.md.
#
# mpi4py is installed by the `mpi` extra of setup.cfg, which tools/install.sh always adds: PyPI's mpi4py 4.1 wheel
# loads the system libmpi.so.40 at run time (Debian's OpenMPI 4.1.4 here, the one mpirun belongs to), and where no
# wheel fits pip builds it with that OpenMPI's mpicc; either way nothing Horovod-specific, so not in this script.
#
# Environment knobs:
#   HARNESS_WHEEL_CACHE   wheel cache folder (default ~/.cache/harness/wheels)
#   HARNESS_HOROVOD_GPU   auto (default: GPU build if nvcc is found and TF is built with CUDA) | 0 | 1
#   HARNESS_HOROVOD_REBUILD=1   ignore the cache and the installed copy, build again
set -euo pipefail
VENV=${1:-.venv}
HVD_VERSION=0.28.1
CACHE_ROOT=${HARNESS_WHEEL_CACHE:-$HOME/.cache/harness/wheels}
PY="$VENV/bin/python"
PIP="$PY -m pip"
log() { echo "[install_horovod] $*" >&2; }

# Keras 2 for every import below (Horovod's Keras modules must not pick up Keras 3).
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2

TF_VERSION=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
  || { log "TensorFlow is not importable in $VENV; install it first"; exit 1; }
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

GPU=${HARNESS_HOROVOD_GPU:-auto}
if [ "$GPU" = auto ]; then
  GPU=0
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    "$PY" -c 'import sys, tensorflow as tf; sys.exit(0 if tf.test.is_built_with_cuda() else 1)' 2>/dev/null && GPU=1
  fi
fi
FLAVOUR=cpu; [ "$GPU" = 1 ] && FLAVOUR=gpu
KEY="horovod-${HVD_VERSION}-tf${TF_VERSION}-${PY_TAG}-${FLAVOUR}"
CACHE="$CACHE_ROOT/$KEY"
STAMP="$VENV/.horovod-build-key"

# 1. Already installed and matching?
if [ "${HARNESS_HOROVOD_REBUILD:-0}" != 1 ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$KEY" ] \
   && "$PY" - "$HVD_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == sys.argv[1], horovod.__version__
assert hvd.mpi_built() and hvd.gloo_built()
EOF
then
  log "horovod $HVD_VERSION already installed for $KEY"
  exit 0
fi

# 3. Build into the cache unless a wheel is there.
shopt -s nullglob
wheels=("$CACHE"/horovod-"$HVD_VERSION"-*.whl)
if [ "${HARNESS_HOROVOD_REBUILD:-0}" = 1 ] || [ ${#wheels[@]} -eq 0 ]; then
  # Build deps of the sdist (setup.py imports packaging; cmake>=3.13 comes from apt, see tools/install.sh).
  $PIP install -q setuptools wheel packaging
  command -v cmake >/dev/null 2>&1 || $PIP install -q "cmake>=3.13,<4"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  log "building $KEY (a few minutes)"
  $PIP download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$WORK"
  SDIST="$WORK/horovod-$HVD_VERSION.tar.gz"
  tar -xzf "$SDIST" -C "$WORK"
  SRC="$WORK/horovod-$HVD_VERSION"
  # No debug info (see the header): after CMakeLists.txt's own -O2 -> -O3 of the RelWithDebInfo flags.
  sed -i 's|^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO .*$|&\nstring(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")|' "$SRC/CMakeLists.txt"
  grep -q 'REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO' "$SRC/CMakeLists.txt" \
    || { log "the build-flag patch did not apply to $SRC/CMakeLists.txt"; exit 1; }
  if "$PY" -c "import sys; from packaging.version import Version as V; sys.exit(0 if V('$TF_VERSION') >= V('2.19') else 1)"; then
    log "TF $TF_VERSION >= 2.19: compiling out horovod/tensorflow/xla_mpi_ops.cc (see header of this script)"
    f="$SRC/horovod/tensorflow/xla_mpi_ops.cc"
    sed -i 's|^#if TENSORFLOW_VERSION >= 2006000000$|#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU \&\& TENSORFLOW_VERSION < 2019000000|' "$f"
    grep -q 'TENSORFLOW_VERSION < 2019000000' "$f" || { log "patch did not apply to $f"; exit 1; }
  fi
  rm -f "$SDIST"
  tar -czf "$SDIST" -C "$WORK" "horovod-$HVD_VERSION"
  rm -rf "${SRC:?}"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
         HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  if [ "$GPU" = 1 ]; then export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}; fi
  # setup.py runs make -j8 unless MAKEFLAGS is set; match the cores we have.
  export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
  mkdir -p "$CACHE"
  $PIP wheel -q --no-deps --no-build-isolation -w "$WORK/wheel" "$SDIST"
  rm -f "$CACHE"/horovod-*.whl
  mv "$WORK"/wheel/horovod-"$HVD_VERSION"-*.whl "$CACHE"/   # mv last, so a failed build leaves no wheel
  wheels=("$CACHE"/horovod-"$HVD_VERSION"-*.whl)
fi

# 2. Install the cached wheel (its runtime deps: cloudpickle, psutil, pyyaml, packaging, cffi).
log "installing ${wheels[0]}"
$PIP install -q --force-reinstall --no-deps "${wheels[0]}"
$PIP install -q "${wheels[0]}"
"$PY" - "$HVD_VERSION" <<'EOF'
import sys
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == sys.argv[1], horovod.__version__
assert hvd.mpi_built() and hvd.gloo_built(), "horovod built without MPI or Gloo"
EOF
echo "$KEY" > "$STAMP"
log "horovod $HVD_VERSION ready ($KEY)"
