"""The starvation case: a CPU-heavy task that starts in a crowd, then competes with two that do not.

``crowd`` is N mapped tasks that sleep; ``long_cpu`` has no upstream but the lowest priority, so the
scheduler queues it after the whole crowd and it starts while the crowd runs. ``cpu_a`` and ``cpu_b``
wait for the crowd to end, then compete with ``long_cpu`` for the cores. Every CPU task does the same
fixed work (W seconds of its own CPU time), so its wall time shows the share of the CPU it got: an
executor that lowers the priority of workloads started in a crowd and never raises it again leaves
``long_cpu`` waiting behind the other two. Sizes come from the environment at parse time (see
bench_dags.py); no retries, no XCom.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task  # type: ignore[no-redef,attr-defined,unused-ignore]

START = datetime(2024, 1, 1)

CROWD = int(os.environ.get("ALE_BENCH_CROWD", "100"))
CROWD_SLEEP = float(os.environ.get("ALE_BENCH_CROWD_SLEEP", "30"))
CPU_SECONDS = float(os.environ.get("ALE_BENCH_CPU_SECONDS", "60"))
# The scheduler queues by priority weight, highest first; "absolute" keeps the weights as written (the
# default rule adds those of a task's downstream tasks), so the order holds whatever the DAG's shape.
CROWD_WEIGHT, LONG_WEIGHT = 100, 1
# Each task's log says what it measured; the benchmark reads the task instance rows, this is for people.
CPU_MARKER = "ale-bench-cpu"


def burn(seconds: float) -> None:
    """Spin in pure Python until this process has used ``seconds`` of CPU: fixed work, whatever its share."""
    wall0, cpu0 = time.monotonic(), time.process_time()
    spins = 0
    while time.process_time() - cpu0 < seconds:
        # A batch between clock reads, so the reads (system calls) are a small part of the work.
        for _ in range(20_000):
            spins += 1
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    print(f"{CPU_MARKER} wall_s={wall:.2f} cpu_s={cpu:.2f} share={cpu / wall if wall else 0:.2f}")


@dag(
    dag_id="bench_starvation",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    # [core] max_active_tasks_per_dag (16 by default) would keep the crowd far below a crowd.
    max_active_tasks=200,
    tags=["benchmark"],
)
def bench_starvation() -> None:
    @task(do_xcom_push=False, retries=0, priority_weight=CROWD_WEIGHT, weight_rule="absolute")
    def crowd(i: int) -> None:
        time.sleep(CROWD_SLEEP)

    @task(do_xcom_push=False, retries=0, priority_weight=LONG_WEIGHT, weight_rule="absolute")
    def long_cpu() -> None:
        burn(CPU_SECONDS)

    @task(do_xcom_push=False, retries=0)
    def cpu_a() -> None:
        burn(CPU_SECONDS)

    @task(do_xcom_push=False, retries=0)
    def cpu_b() -> None:
        burn(CPU_SECONDS)

    crowd.expand(i=list(range(CROWD))) >> [cpu_a(), cpu_b()]
    long_cpu()


bench_starvation()
