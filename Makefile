# Every target installs what it needs into .venv from the committed lock file, so every machine runs
# the same versions.
PYTHON ?= python3
VENV ?= .venv
LOCK ?= constraints/airflow-3.3.2-py3.11.txt
BIN := $(VENV)/bin
# The same package on Airflow 2.11, in a virtualenv of its own with its own lock file.
VENV2 ?= .venv-airflow2
LOCK2 ?= constraints/airflow-2.11.2-py3.11.txt
BIN2 := $(VENV2)/bin
# The oldest Airflow 2 supported, 2.10, for the same Airflow 2 tests (no Celery extra: its provider needs 2.11).
VENV210 ?= .venv-airflow210
LOCK210 ?= constraints/airflow-2.10.5-py3.11.txt
BIN210 := $(VENV210)/bin
PYTEST_ARGS ?=
# Where the environment sets PYTHONDONTWRITEBYTECODE, every pytest worker would rewrite the asserts of
# every test module again (half of a worker's collection, 4.7 s of CPU) and every Airflow process
# would compile this package anew: the suite keeps its bytecode caches (__pycache__, git-ignored).
unexport PYTHONDONTWRITEBYTECODE
# Benchmarks: which executor variants to compare (each against stock) and where results go.
BENCH_VARIANTS ?= stock,ours
BENCH_ARGS ?=

.PHONY: install install-airflow2 install-airflow210 install-browser test test-airflow3 test-airflow2 test-airflow210 \
	test-unit-airflow210 test-e2e test-smoke \
	test-core test-unit lint demo docs screenshots lock lock-airflow2 lock-airflow210 \
	clean bench bench-full bench-smoke bench-airflow2

# A virtualenv from a lock file. $(1): the virtualenv; $(2): the lock file; $(3): the extras.
# Everything the lock file pins goes in first, which several virtualenvs can do at once (make test builds
# all three side by side); then the package itself, one build at a time: the
# build leaves src/*.egg-info beside the package, on sys.path through the editable install, where Airflow
# would find the package's entry points twice ("Plugin 'async_local_executor' already registered").
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet --requirement $(2)
	mkdir -p build
	flock build/.install.lock sh -c "$(1)/bin/pip install --quiet --constraint $(2) --editable $(3) && rm -rf src/*.egg-info"
	touch $@
endef

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(call make_venv,$(VENV),$(LOCK),$(EXTRAS))

install-airflow2: $(VENV2)/.installed

$(VENV2)/.installed: pyproject.toml $(LOCK2)
	$(call make_venv,$(VENV2),$(LOCK2),$(EXTRAS))

install-airflow210: $(VENV210)/.installed

$(VENV210)/.installed: pyproject.toml $(LOCK210)
	$(call make_venv,$(VENV210),$(LOCK210),$(EXTRAS_210))

# The browser test drives Debian's Chromium (Playwright is told to use it and downloads nothing).
CHROMIUM ?= /usr/bin/chromium

install-browser: $(CHROMIUM)

$(CHROMIUM):
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# Everything: first the benchmark suite's smoke run alone (it runs both executors two at a time, and the
# stock LocalExecutor's tasks time out on a starved api-server when other suites share the cores); then
# three lanes side by side: the Airflow 3.3 end-to-end tests over XDIST pytest-xdist workers, the
# Airflow 2 tests on 2.11, and the tests that start no Airflow deployment, then the Airflow 2 tests on
# 2.10, then the Airflow 3.3 end-to-end modules of E2E_LATE (which the first lane leaves out). The cores
# are busy throughout (the suite takes about 28 CPU-minutes); E2E_LATE evens the lanes' ends out, so
# that no lane runs alone at the end. TEST_JOBS=1 XDIST=0 runs everything one after the other. README,
# "Tests", has the timings.
TEST_JOBS ?= 3
XDIST ?= 2
E2E_LATE ?= tests/e2e/test_restart_chaos.py tests/e2e/test_switch_to_local.py tests/e2e/test_live_control.py

# Every virtualenv first, side by side (make_venv builds the package one at a time): a build leaves
# src/*.egg-info on the other virtualenvs' sys.path for a moment (see make_venv), where an Airflow the
# other lane starts would find the package twice.
test:
	$(MAKE) --no-print-directory --jobs=3 install install-browser install-airflow2 install-airflow210
	$(MAKE) --no-print-directory test-smoke
	$(MAKE) --no-print-directory --jobs=$(TEST_JOBS) --output-sync=target test-e2e test-airflow2 test-unit-airflow210 \
		E2E_IGNORE="$(foreach module,$(E2E_LATE),--ignore=$(module))"

# The third lane of make test.
test-unit-airflow210:
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-airflow210
	$(if $(E2E_LATE),$(BIN)/python -m pytest $(E2E_LATE) --durations=5 $(PYTEST_ARGS))

# The suite on Airflow 3.3: the tests that start no Airflow deployment, then those that do.
test-airflow3: test-unit
	$(MAKE) --no-print-directory test-smoke
	$(MAKE) --no-print-directory test-e2e

# The tests that start a real Airflow 3.3 deployment (marked e2e), but the benchmark smoke run. A module's
# tests stay on one worker (--dist=loadscope), so a module-scoped deployment starts once.
# E2E_IGNORE: what another lane runs (make test).
test-e2e: install install-browser
	$(BIN)/python -m pytest -m e2e --ignore=tests/bench/test_smoke.py $(E2E_IGNORE) --numprocesses=$(XDIST) \
		--dist=loadscope --durations=25 $(PYTEST_ARGS)

# The benchmark suite's smoke profile, end to end (tests/bench/test_smoke.py): both executors, every
# scenario, two runs at a time.
test-smoke: install
	$(BIN)/python -m pytest tests/bench/test_smoke.py $(PYTEST_ARGS)

# The executor page's screenshots in docs/images, from the browser test on a real Airflow.
screenshots: install install-browser
	ALE_SCREENSHOTS=docs/images $(BIN)/python -m pytest tests/e2e/test_health_page.py $(PYTEST_ARGS)

# tests/core is Airflow-free and already ran above; tests/airflow2 is what differs.
test-airflow2: install-airflow2
	$(BIN2)/python -m pytest tests/airflow2 --durations=10 $(PYTEST_ARGS)

# 2.10 runs only the tests marked airflow210: those of what differs from 2.11 in this package's paths (the
# unlaunched task's log file name, read from the run's log template in the database on 2.10; the audit
# record; `tasks run` forked from a helper that preloaded 2.10; what a forked task observes; the ORM's
# mappers; the revoke of a task stuck in queued; a crash's row locks, seen on 2.10.5; its migrations).
# The executor API (airflow/executors), LocalTaskJob, the task runner, the plugin and executor loaders
# and the scheduler's adoption are the same code in 2.10.5 and 2.11.2, so the stub-driven executor
# tests, the handover and its revoke, learned preloading, SIGTERM's bounded shutdown and the
# subprocess/p0 end-to-end run are left to 2.11. tests/airflow2/README.md has the list and the diff.
test-airflow210: install-airflow210
	$(BIN210)/python -m pytest tests/airflow2 -m airflow210 --durations=10 $(PYTEST_ARGS)

# The quick loop: the supervisor, its launchers and the operations layer, with real child processes and
# no Airflow deployment (tests/core, tests/ops).
test-core: install
	$(BIN)/python -m pytest tests/core tests/ops $(PYTEST_ARGS)

# Every test that starts no Airflow deployment (not marked e2e), on Airflow 3.3: tests/core, tests/ops,
# tests/adapter, tests/packaging, tests/bench/test_cases.py and test_roles.py (as root it listens to the
# kernel's exit records for a second, as the benchmarks do), and the chaos checker's. Real child
# processes, fork servers and `airflow` CLI commands, but no api-server, scheduler or dag-processor.
# Much of it waits on children, so UNIT_JOBS pytest-xdist workers share the 2 cores.
UNIT_JOBS ?= 4
test-unit: install
	$(BIN)/python -m pytest -m 'not e2e' --numprocesses=$(UNIT_JOBS) --durations=10 $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src harness tests benchmarks
	$(BIN)/ruff format --check src harness tests benchmarks
	$(BIN)/mypy

demo: install
	$(BIN)/python -m harness.demo

# The configuration reference (from the provider info) and design.md's module map (from the modules'
# docstrings) are generated; tests check both are current.
docs: install
	$(BIN)/python -m async_local_executor.adapter.provider > docs/configuration.md
	$(BIN)/python -m tests.packaging.design_doc

# Quick profile (about 20 minutes on 2 cores): refreshes docs/benchmarks.md and its charts.
bench: install
	$(BIN)/python -m benchmarks --profile quick --variants $(BENCH_VARIANTS) --out build/bench/quick.jsonl \
		--charts docs/benchmarks --markdown docs/benchmarks.md $(BENCH_ARGS)

bench-full: install
	$(BIN)/python -m benchmarks --profile full --variants $(BENCH_VARIANTS) --out build/bench/full.jsonl \
		--charts docs/benchmarks --markdown docs/benchmarks.md $(BENCH_ARGS)

# The quick profile on Airflow 2.11 (PostgreSQL): stock 2.11 LocalExecutor against this executor.
bench-airflow2: install-airflow2
	$(BIN2)/python -m benchmarks --profile quick --variants $(BENCH_VARIANTS) --out build/bench/airflow2-quick.jsonl \
		--charts docs/benchmarks-airflow2 --markdown docs/benchmarks-airflow2.md $(BENCH_ARGS)

# A few tasks, one repetition, two runs at a time: proves the harness works (tests/bench runs the same
# profile), not how the variants compare. Every bench target needs PostgreSQL on 127.0.0.1:5432 for the
# burst scenario (the other scenarios use SQLite).
bench-smoke: install
	$(BIN)/python -m benchmarks --profile smoke --variants $(BENCH_VARIANTS) --jobs 2 --out build/bench/smoke.jsonl \
		--charts build/bench/smoke-charts $(BENCH_ARGS)

# Install into a throwaway virtualenv and freeze it into a lock file.
# $(1): what to install; $(2): what the set is; $(3): the lock file.
define freeze_lock
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet $(1)
	{ echo '# $(2) and everything it pulls in, plus the test and benchmark tools.'; \
	  echo '# Regenerate with `make $@` after changing a dependency.'; \
	  .lock-venv/bin/pip freeze | grep -v -i '^async.local.executor'; } > $(3)
	rm -rf .lock-venv
endef

EXTRAS := '.[uvloop,test,test-celery,test-ui,bench,dev]'
# Airflow 2.10: without test-celery (its Celery provider needs Airflow 2.11).
EXTRAS_210 := '.[uvloop,test,bench,dev]'

lock:
	$(call freeze_lock,$(EXTRAS),The tested set: apache-airflow 3.3.2,$(LOCK))

lock-airflow2:
	$(call freeze_lock,'apache-airflow==2.11.2' $(EXTRAS),The tested Airflow 2 set: apache-airflow 2.11.2,$(LOCK2))

lock-airflow210:
	$(call freeze_lock,'apache-airflow==2.10.5' $(EXTRAS_210),The tested Airflow 2.10 set: apache-airflow 2.10.5,$(LOCK210))

clean:
	rm -rf $(VENV) $(VENV2) $(VENV210) build *.egg-info src/*.egg-info
