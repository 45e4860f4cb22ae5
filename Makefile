# Every target installs what it needs into .venv from the committed lock file, so every machine runs
# the same versions.
PYTHON ?= python3
VENV ?= .venv
LOCK ?= constraints/airflow-3.3.2-py3.11.txt
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Benchmarks: which executor variants to compare (each against stock) and where results go.
BENCH_VARIANTS ?= stock,ours
BENCH_ARGS ?=

.PHONY: install test test-core lint demo docs lock clean bench bench-full bench-smoke

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint $(LOCK) --editable '.[uvloop,test,bench]'
	touch $@

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-core: install
	$(BIN)/python -m pytest tests/core tests/adapter $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

demo: install
	$(BIN)/python -m async_local_executor.demo

# The configuration reference is generated from the provider info (tests check it is current).
docs: install
	$(BIN)/python -m async_local_executor.provider > docs/configuration.md

# Quick profile (about 10 minutes on 2 cores): refreshes docs/benchmarks.md and its charts.
bench: install
	$(BIN)/python -m benchmarks --profile quick --variants $(BENCH_VARIANTS) --out build/bench/quick.jsonl \
		--charts docs/benchmarks --markdown docs/benchmarks.md $(BENCH_ARGS)

bench-full: install
	$(BIN)/python -m benchmarks --profile full --variants $(BENCH_VARIANTS) --out build/bench/full.jsonl \
		--charts docs/benchmarks --markdown docs/benchmarks.md $(BENCH_ARGS)

# A few tasks, one repetition: proves the harness works (tests/bench runs the same profile).
bench-smoke: install
	$(BIN)/python -m benchmarks --profile smoke --variants $(BENCH_VARIANTS) --out build/bench/smoke.jsonl \
		--charts build/bench/smoke-charts $(BENCH_ARGS)

lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet '.[uvloop,test,bench]'
	{ echo '# The tested set: apache-airflow 3.3.2 and everything it pulls in, plus the test and benchmark tools.'; \
	  echo '# Regenerate with `make lock` after changing a dependency.'; \
	  .lock-venv/bin/pip freeze | grep -v -i '^async.local.executor'; } > $(LOCK)
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
