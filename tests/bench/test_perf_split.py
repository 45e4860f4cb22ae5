"""The split of ``perf script``'s samples by role (fork-server helper, workload, task) and by kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.perf_split import USER, main, render, split
from benchmarks.roles import helper_pids

HELPER, WORKLOAD, TASK, TASK_CHILD, OTHER = 100, 200, 300, 400, 500
EVENTS = [
    # A thread of the helper (same pid, new tid) is no process of its own.
    f"python3 {HELPER}/{HELPER} 1.0: PERF_RECORD_FORK({HELPER}:{HELPER + 1}):({HELPER}:{HELPER})",
    f"python3 {HELPER}/{HELPER} 1.1: PERF_RECORD_FORK({WORKLOAD}:{WORKLOAD}):({HELPER}:{HELPER})",
    f"airflow worker {WORKLOAD}/{WORKLOAD} 1.2: PERF_RECORD_FORK({TASK}:{TASK}):({WORKLOAD}:{WORKLOAD})",
    f"airflow worker {TASK}/{TASK} 1.3: PERF_RECORD_FORK({TASK_CHILD}:{TASK_CHILD}):({TASK}:{TASK})",
    f"airflow {OTHER - 1}/{OTHER - 1} 1.4: PERF_RECORD_FORK({OTHER}:{OTHER}):({OTHER - 1}:{OTHER - 1})",
]
MS = 1_000_000  # a sample's period, in ns


def sample(comm: str, pid: int, period: int, *frames: str) -> str:
    chain = "".join(f"\tffffffff81000000 {frame}\n" for frame in frames)
    return f"{comm} {pid}/{pid} 2.000: {period} cpu-clock:pppH:\n{chain}\n"


SCRIPT = "".join(
    [
        sample("python3", HELPER, 3 * MS, "copy_page_range", "dup_mm", "copy_process", "__do_sys_clone"),
        sample(
            "python3", WORKLOAD, 2 * MS, "copy_mc_enhanced_fast_string", "do_wp_page", "asm_exc_page_fault"
        ),
        sample(
            "python3", WORKLOAD, 1 * MS, "exc_page_fault", "asm_exc_page_fault", "_PyEval_EvalFrameDefault"
        ),
        sample("ale-custody", WORKLOAD, 4 * MS, "unmap_page_range", "exit_mmap", "mmput", "do_exit"),
        sample("airflow worker", WORKLOAD, 5 * MS, "_PyEval_EvalFrameDefault", "[unknown]"),
        sample("airflow worker", WORKLOAD, 1 * MS, "do_sys_poll", "do_syscall_64", "entry_SYSCALL_64"),
        sample("airflow worker", TASK, 7 * MS, "_PyType_Lookup"),
        sample("airflow worker", TASK_CHILD, 1 * MS, "do_wp_page", "asm_exc_page_fault"),
        sample("airflow", OTHER, 50 * MS, "_PyEval_EvalFrameDefault"),
    ]
)


def test_samples_are_split_by_the_role_their_process_has_below_a_helper_and_by_kernel_frames() -> None:
    found = split(SCRIPT.splitlines(), EVENTS, {HELPER})
    assert found.workloads == 1
    assert found.per_task_ms("fork server") == pytest.approx(3.0)
    assert found.per_task_ms("fork server", "fork: page tables copied") == pytest.approx(3.0)
    assert found.per_task_ms("workload process") == pytest.approx(13.0)
    assert found.per_task_ms("workload process", "page fault: copy-on-write") == pytest.approx(2.0)
    assert found.per_task_ms("workload process", "page fault: other") == pytest.approx(1.0)
    # Whichever thread tears the address space down, the time is the process's.
    assert found.per_task_ms("workload process", "exit: address space torn down") == pytest.approx(4.0)
    assert found.per_task_ms("workload process", "other system calls") == pytest.approx(1.0)
    assert found.per_task_ms("workload process", USER) == pytest.approx(5.0)
    # The task process and what it starts; a process outside every helper's tree counts nowhere.
    assert found.per_task_ms("task process") == pytest.approx(8.0)
    assert found.per_task_ms("task process", "page fault: copy-on-write") == pytest.approx(1.0)
    assert sum(found.seconds.values()) == pytest.approx(0.024)


def test_the_table_shows_each_kind_and_the_totals() -> None:
    table = render(split(SCRIPT.splitlines(), EVENTS, {HELPER}))
    assert "| page fault: copy-on-write | 0.0 | 2.0 | 1.0 |" in table
    assert "| **total** | **3.0** | **13.0** | **8.0** |" in table


def test_the_helpers_come_from_the_scheduler_log() -> None:
    log = "INFO fork server ready (pid 4242)\nINFO other\nfork server ready (pid 77)\n"
    assert helper_pids(log) == {4242, 77}


def test_a_log_that_names_no_helper_is_refused_before_perf_runs(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text("no helper here\n")
    assert main([str(tmp_path / "perf.data"), str(log)]) == 2
