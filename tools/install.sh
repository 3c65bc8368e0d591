#!/usr/bin/env bash
# One install path for `make install`, CI and the Dockerfile.
#   tools/install.sh VENV [EXTRAS]     e.g. tools/install.sh .venv cpu,profile,mlflow,test
# PYTHON: the interpreter that makes VENV (default python3; it must be one setup.cfg's python_requires allows).
# Idempotent: packages already present are not fetched again.
set -euo pipefail
VENV=${1:-.venv}
EXTRAS=${2:-cpu,profile,mlflow,test}
HERE=$(cd "$(dirname "$0")/.." && pwd)

# System packages: OpenMPI (mpirun, and headers for mpi4py and Horovod's MPI controller).
need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] \
  || need_apt+=(libopenmpi-dev)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
# The multi-host tests' bed (tests/cluster/bed.py): ip and tc (iproute2), nsenter and unshare (util-linux).
{ command -v ip && command -v tc; } >/dev/null 2>&1 || need_apt+=(iproute2)
{ command -v nsenter && command -v unshare; } >/dev/null 2>&1 || need_apt+=(util-linux)
# tests/test_ports_inventory.py traces every listen(2) of a run (Gloo's listeners outlive no poll).
command -v strace >/dev/null 2>&1 || need_apt+=(strace)
# tests/test_quickstart.py opens the run report in a real headless browser (tests/browser.py): Debian's Chromium,
# only where the test extra is installed (not in the Docker image).
case ",$EXTRAS," in *,test,*) command -v chromium >/dev/null 2>&1 || need_apt+=(chromium) ;; esac
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# setuptools < 81: 81 dropped the pkg_resources that TensorBoard 2.18 imports (setup.cfg's `profile` extra pins the
# same bound; repeated here so that this upgrade, run on every install, never undoes it). Horovod's build uses it.
$PIP install -q --upgrade pip wheel "setuptools<81"
# `mpi` (mpi4py) always goes with Horovod, which is always installed (below).
$PIP install -q -e "$HERE[${EXTRAS:+$EXTRAS,}mpi]"
# Keras 2 for TF 2.18 (see setup.cfg): --no-deps, or it pulls the full `tensorflow` wheel.
$PIP install -q --no-deps "tf-keras>=2.21,<2.22"
# Horovod 0.28.1 built from its sdist against this TF, with MPI and Gloo; cached wheel (see the script).
bash "$HERE/tools/install_horovod.sh" "$VENV"
# The MLflow tracking server the tests start (tests/train/report/test_tracking.py): the full `mlflow` package, in a
# venv of its own under VENV, so that its scikit-learn never enters VENV. Keras 3 imports scikit-learn at
# `import tensorflow` wherever it is installed: 6.3-6.9 CPU-s a TF import with it, 3.7-4.1 without (this machine,
# `python -c "import tensorflow"` timed with time.process_time, 3 runs each), in every process of the suite.
case ",$EXTRAS," in
  *,test,*)
    [ -x "$VENV/services/bin/python" ] || "$VENV/bin/python" -m venv "$VENV/services"
    "$VENV/services/bin/python" -m pip install -q "mlflow>=3,<4" ;;
esac
