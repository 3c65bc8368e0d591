# make install | demo | test | bench   (see README.md)
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= cpu,profile,mlflow,test
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml tools/install.sh tools/install_horovod.sh
	bash tools/install.sh $(VENV) $(EXTRAS)
	touch $@

demo: install
	$(VENV)/bin/harness demo

# Three pytest-xdist workers, a file at a time each, in the order tests/conftest.py gives (RUN_FIRST; xdist would
# otherwise send the files with the most tests first); the files marked `waits` are one group, run by one worker
# beside the others, and at most 2 other tests run at once (tests/README.md). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 tests

bench: install
	$(PY) benchmarks/input_pipeline.py
	$(PY) benchmarks/gcs_read.py
	$(PY) benchmarks/reshard.py
	$(PY) benchmarks/tune.py
	$(PY) benchmarks/profile_overhead.py
	$(PY) benchmarks/predict.py
	$(PY) benchmarks/quicklook.py
	$(PY) benchmarks/per_pixel.py
	$(PY) benchmarks/step_loop.py
	$(PY) benchmarks/cluster.py
	$(PY) benchmarks/published_scaling.py
	$(VENV)/bin/harness bench train --data synthetic --steps 30 --output runs/bench/synthetic

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
