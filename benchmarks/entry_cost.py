"""What a forked workload costs before Airflow's task supervisor starts: CPU and page faults per child.

A process preloads what the fork server preloads for every Airflow 3 workload, then forks children the
way the helper does and measures each from its parent (``wait4``: its CPU time, exit included, and its
minor page faults, which under a fork are mostly copy-on-write), in four shapes:

- ``exit``: the child exits at once (what any forked child pays: the fork's aftermath and its exit);
- ``read``: it reads and validates the workload, then exits;
- ``entry``: it runs the workload entry point up to the supervisor (its flags, its tie to the executor,
  the workload read), without a handover;
- ``entry + custody``: the same with a handover, as the executor runs every workload by default
  (the custody watchdog and the output relay start).

Usage: ``python -m benchmarks.entry_cost [--children N]``. Nothing runs the supervisor: that part is
Airflow's, and the role account (:mod:`benchmarks.roles`) measures it in a real deployment.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Final

_PR_GET_DUMPABLE: Final = 3  # a prctl that changes nothing
SHAPES: Final[tuple[str, ...]] = ("exit", "read", "entry", "entry + custody")


@dataclasses.dataclass(frozen=True)
class Cost:
    """Medians over the children of one shape."""

    cpu_ms: float
    faults: float


def _payload() -> bytes:
    from async_local_executor.adapter.workload import airflow3
    from benchmarks.scenarios.dispatch_driver import workload

    return airflow3.encode_payload(workload(0).model_dump_json(), "http://127.0.0.1:9/execution/", "t")


def _child(shape: str, payload: bytes, custody_dir: str) -> Callable[[], int]:
    from async_local_executor.adapter.workload import airflow3, entry

    def read() -> int:
        airflow3._read(payload)
        return 0

    def run(argv: tuple[str, ...]) -> Callable[[], int]:
        # The entry point as the helper's child runs it, with a run that returns instead of supervising.
        skeleton = dataclasses.replace(airflow3._ENTRY, run=lambda _: 0)
        return lambda: skeleton.forked_main(list(argv), payload)

    parent = os.getpid()
    return {
        "exit": lambda: 0,
        "read": read,
        "entry": run(entry.argv_flags(parent, "normal")),
        "entry + custody": run(
            entry.argv_flags(parent, "normal", handover_timeout=300.0, custody_dir=custody_dir)
        ),
    }[shape]


def measure(shape: str, children: int, payload: bytes, custody_dir: str) -> Cost:
    """Fork ``children`` children of ``shape`` one after the other; their medians."""
    body = _child(shape, payload, custody_dir)
    cpu, faults = [], []
    for _ in range(children):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = body()
            finally:
                os._exit(code)
        _, status, usage = os.wait4(pid, 0)
        if (code := os.waitstatus_to_exitcode(status)) != 0:  # a child cut short would measure cheap
            raise RuntimeError(
                f"a child of shape {shape!r} exited with {code}, not 0: its figures mean nothing"
            )
        cpu.append(1000.0 * (usage.ru_utime + usage.ru_stime))
        faults.append(float(usage.ru_minflt))
    return Cost(statistics.median(cpu), statistics.median(faults))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.entry_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--children", type=int, default=40, help="children per shape (default 40)")
    args = parser.parse_args(argv)
    from async_local_executor.adapter.workload import airflow3
    from async_local_executor.core import lifeline

    airflow3.preload()  # what the helper imports for every workload (no learned modules)
    lifeline.prctl(_PR_GET_DUMPABLE, 0)  # libc, loaded once as the helper's own prctl loads it
    payload = _payload()
    gc.collect()
    gc.freeze()  # as the helper does before its first fork
    with tempfile.TemporaryDirectory() as custody_dir:
        costs = {shape: measure(shape, args.children, payload, custody_dir) for shape in SHAPES}
    print(f"per forked child, median of {args.children}:")
    print("| shape | CPU ms | minor page faults |")
    print("|---|---|---|")
    for shape, cost in costs.items():
        print(f"| {shape} | {cost.cpu_ms:.2f} | {cost.faults:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
