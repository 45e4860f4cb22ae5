"""How long one end-to-end test's deployment takes to start and stop, step by step.

    .venv/bin/python -m benchmarks.sandbox_cycle [--cycles 5] [--database sqlite] [--run]

Starts and stops the deployment the ``sandbox`` fixture of tests/e2e gives a test with no options (this
executor, tests/e2e/dags, parallelism 4) ``--cycles`` times, after one start that makes the migrated
template (not counted). For each cycle: the time to a healthy deployment, then until the dag-processor
has serialized the DAG a test runs (what nearly every test waits for first), with ``--run`` one run of it
(the ``observe`` DAG's four tasks: the stop then follows tasks, as a test's does), then the stop, and the
steps the sandbox says it took. Prints each cycle and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from harness import templates
from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import DAGS, SWITCH_TASKS, TEST_DIR_ENVS

DAG_ID = "observe"  # tests/e2e/dags/observe.py


def cycle(database: str, run: bool, steps: dict[str, list[float]]) -> dict[str, float]:
    """One start, wait for the DAG, run it if ``run``, stop; the phases' seconds (the sandbox's own steps
    go to ``steps``)."""
    started: dict[str, float] = {}

    def progress(line: str) -> None:
        if line.endswith(" ..."):
            started[line.removesuffix(" ...")] = time.monotonic()
        elif " done in " in line:
            what = line.rsplit(" done in ", 1)[0]
            if what in started:
                steps[what].append(time.monotonic() - started.pop(what))

    sandbox = AirflowSandbox(
        executor=EXECUTOR,
        database=database,
        dags_folder=DAGS,
        parallelism=SWITCH_TASKS,
        extra_config=dict.fromkeys(TEST_DIR_ENVS, "/nonexistent"),
        progress=progress,
    )
    begin = time.monotonic()
    sandbox.start()
    healthy = time.monotonic()
    try:
        sandbox.wait_for_dag(DAG_ID)
        parsed = time.monotonic()
        if run:
            assert sandbox.wait_for_run(DAG_ID, sandbox.trigger(DAG_ID)) == "success"
    finally:
        ran = time.monotonic()
        sandbox.stop()
        stopped = time.monotonic()
    took = {"start (healthy)": healthy - begin, "dag parsed": parsed - healthy}
    if run:
        took["run"] = ran - parsed
    took.update({"stop": stopped - ran, "start+stop": healthy - begin + stopped - ran})
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--database", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--run", action="store_true", help="run the observe DAG once before each stop")
    args = parser.parse_args()
    # The first home of its kind migrates the template; tests pay that once per process.
    templates.template_for(AirflowSandbox(database=args.database, dags_folder=DAGS, progress=None))
    phases: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, list[float]] = defaultdict(list)
    for number in range(1, args.cycles + 1):
        took = cycle(args.database, args.run, steps)
        for name, seconds in took.items():
            phases[name].append(seconds)
        print(f"cycle {number}: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in took.items()))
    print(f"medians over {args.cycles} cycles ({args.database}):")
    for name, values in (*phases.items(), *steps.items()):
        print(f"  {name:<70} {statistics.median(values):6.2f}s")


if __name__ == "__main__":
    main()
