"""The split of ``perf script``'s samples by role (fork-server helper, workload, task) and by kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.perf_split import START, USER, WrongEvent, main, render, split
from benchmarks.roles import helper_pids

SCHEDULER, HELPER, WORKLOAD, TASK, TASK_CHILD, CHECK, OTHER = 50, 100, 200, 300, 400, 600, 500
MS = 1_000_000  # a sample's period, in ns


def fork(comm: str, parent: int, child: int, thread: int | None = None) -> str:
    tid = child if thread is None else thread
    return f"{comm} {parent}/{parent} 1.0: PERF_RECORD_FORK({child}:{tid}):({parent}:{parent})\n"


def title(pid: int, name: str) -> str:
    return f"{name} {pid}/{pid} 1.0: PERF_RECORD_COMM: {name}:{pid}/{pid}\n"


def sample(comm: str, pid: int, period: int, *frames: str, event: str = "cpu-clock:pppH") -> str:
    chain = "".join(f"\tffffffff81000000 {frame}\n" for frame in frames)
    return f"{comm} {pid}/{pid} 2.000: {period} {event}: \n{chain}\n"


# The helper is the scheduler's child; the workload, forked with CLONE_PARENT, still shows the helper
# as the process that forked it (perf records the forking process).
SCRIPT = "".join(
    [
        fork("airflow", SCHEDULER, HELPER),
        sample("python3", HELPER, 9 * MS, "_PyEval_EvalFrameDefault"),  # its imports, once
        fork("python3", HELPER, HELPER, thread=HELPER + 1),  # a thread of the helper: no process
        fork("python3", HELPER, WORKLOAD),
        sample("python3", HELPER, 3 * MS, "copy_page_range", "dup_mm", "copy_process", "__do_sys_clone"),
        sample(
            "python3", WORKLOAD, 2 * MS, "copy_mc_enhanced_fast_string", "do_wp_page", "asm_exc_page_fault"
        ),
        sample(
            "python3", WORKLOAD, 1 * MS, "exc_page_fault", "asm_exc_page_fault", "_PyEval_EvalFrameDefault"
        ),
        title(WORKLOAD, "airflow worker"),
        fork("airflow worker", WORKLOAD, TASK),
        sample("airflow worker", WORKLOAD, 5 * MS, "_PyEval_EvalFrameDefault", "[unknown]"),
        sample("airflow worker", WORKLOAD, 1 * MS, "do_sys_poll", "do_syscall_64", "entry_SYSCALL_64"),
        sample("airflow worker", TASK, 7 * MS, "_PyType_Lookup"),
        fork("airflow worker", TASK, TASK_CHILD),
        sample("airflow worker", TASK_CHILD, 1 * MS, "do_wp_page", "asm_exc_page_fault"),
        # Whichever thread tears the address space down, the time is the process's.
        sample("ale-custody", WORKLOAD, 4 * MS, "unmap_page_range", "exit_mmap", "mmput", "do_exit"),
        f"ale-custody {WORKLOAD}/{WORKLOAD + 1} 3.0: PERF_RECORD_EXIT({WORKLOAD}:{WORKLOAD}):({HELPER}:{HELPER})\n",
        # A child the helper forked to answer a check: never titled, forks nothing; the fork server's work.
        fork("python3", HELPER, CHECK),
        sample("python3", CHECK, 2 * MS, "_PyEval_EvalFrameDefault"),
        # The workload's pid, reused by a process of Airflow's: none of its samples are the workload's.
        fork("airflow", OTHER, WORKLOAD),
        sample("airflow", WORKLOAD, 50 * MS, "_PyEval_EvalFrameDefault"),
        sample("airflow", OTHER, 50 * MS, "_PyEval_EvalFrameDefault"),
    ]
)


def test_samples_are_split_by_the_role_their_process_has_below_a_helper_and_by_kernel_frames() -> None:
    found = split(SCRIPT.splitlines(), {HELPER})
    assert found.workloads == 1
    assert found.kernel_frames
    assert found.per_task_ms("fork server", "fork: page tables copied") == pytest.approx(3.0)
    assert found.per_task_ms("fork server", USER) == pytest.approx(2.0)  # the check's child
    assert found.per_task_ms("fork server", START) == pytest.approx(9.0)
    assert found.per_task_ms("workload process") == pytest.approx(13.0)
    assert found.per_task_ms("workload process", "page fault: copy-on-write") == pytest.approx(2.0)
    assert found.per_task_ms("workload process", "page fault: other") == pytest.approx(1.0)
    assert found.per_task_ms("workload process", "exit: address space torn down") == pytest.approx(4.0)
    assert found.per_task_ms("workload process", "other system calls") == pytest.approx(1.0)
    assert found.per_task_ms("workload process", USER) == pytest.approx(5.0)
    # The task process and what it starts; a process outside every helper's tree counts nowhere.
    assert found.per_task_ms("task process") == pytest.approx(8.0)
    assert found.per_task_ms("task process", "page fault: copy-on-write") == pytest.approx(1.0)
    assert sum(found.seconds.values()) == pytest.approx(0.035)


def test_the_table_shows_each_kind_and_the_totals() -> None:
    table = render(split(SCRIPT.splitlines(), {HELPER}))
    assert "| page fault: copy-on-write | 0.0 | 2.0 | 1.0 |" in table
    assert "| **total** | **14.0** | **13.0** | **8.0** |" in table
    assert "kptr_restrict" not in table


def test_samples_without_a_known_kernel_frame_are_said_to_be_all_user_code() -> None:
    script = (
        fork("p", HELPER, WORKLOAD)
        + title(WORKLOAD, "airflow worker")
        + sample("p", WORKLOAD, MS, "[unknown]")
    )
    found = split(script.splitlines(), {HELPER})
    assert not found.kernel_frames
    assert "kptr_restrict" in render(found)


def test_a_recording_of_another_event_than_the_cpu_clock_is_refused() -> None:
    script = fork("p", HELPER, WORKLOAD) + sample("p", WORKLOAD, 123456, "x", event="cycles:P")
    with pytest.raises(WrongEvent, match="record with -e cpu-clock"):
        split(script.splitlines(), {HELPER})


def test_the_helpers_come_from_the_scheduler_log() -> None:
    log = "INFO fork server ready (pid 4242)\nINFO other\nfork server ready (pid 77)\n"
    assert helper_pids(log) == {4242, 77}


def test_a_log_that_names_no_helper_is_refused_before_perf_runs(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text("no helper here\n")
    assert main([str(tmp_path / "perf.data"), str(log)]) == 2
