"""Every figure the suite reports: unit, which direction is better, and what it means.

The terminal table, the ratios and docs/benchmarks.md all read this registry, so a figure is explained
in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from benchmarks import roles

Better = Literal["lower", "higher", "none"]


@dataclass(frozen=True)
class Metric:
    unit: str
    better: Better
    meaning: str
    # A word (the record's "text"), not a number: no median, no ratio.
    word: bool = False


_CPU: Final[dict[str, Metric]] = {
    "scheduler_cpu_s": Metric(
        "s",
        "lower",
        "CPU seconds (user+system) of the scheduler and every descendant, reaped children included, "
        "from trigger to the end of the measured phase; task processes are descendants, so this is the "
        "whole cost of running the tasks",
    ),
    "scheduler_cpu_per_task_s": Metric("s", "lower", "scheduler_cpu_s divided by the tasks that ran"),
    "scheduler_process_cpu_s": Metric(
        "s",
        "lower",
        "CPU seconds of the scheduler process alone (its scheduling loop, plus the executor's own "
        "thread for AsyncLocalExecutor)",
    ),
    "workload_cpu_per_task_s": Metric(
        "s",
        "lower",
        "scheduler_cpu_s minus scheduler_process_cpu_s, per task: what running one workload cost in "
        "workers, fork server, supervisor and task processes",
    ),
    "api_server_cpu_s": Metric("s", "lower", "CPU seconds of the api-server tree over the same phase"),
    "api_server_cpu_per_task_s": Metric("s", "lower", "api_server_cpu_s divided by the tasks that ran"),
    "dag_processor_cpu_s": Metric("s", "lower", "CPU seconds of the dag-processor tree (context only)"),
}

# Where each task's CPU went, by role (benchmarks/roles.py): the names and meanings are roles.py's.
_ROLES: Final[dict[str, Metric]] = {
    roles.metric(role): Metric(
        "s",
        "lower",
        f"CPU seconds per task ran of the {roles.LABELS[role]} over the measured phase (the kernel's exit "
        "records; none when the run could not have them, as its notes say)",
    )
    for role in roles.ROLES
} | {
    roles.EXITS: Metric(
        "s",
        "lower",
        "CPU seconds per task ran of the exits' teardowns the kernel's exit records miss, in the subtrees "
        "the scheduler reaped: counted in the workload process's figure, though the task process's own "
        "is part of it (none under the stock executor, whose workers reap their tasks)",
    )
}

_LOOP: Final[dict[str, Metric]] = {
    "executor_heartbeat_p50_ms": Metric(
        "ms", "lower", "median duration of the executor's heartbeat() as the scheduler called it"
    ),
    "executor_heartbeat_p99_ms": Metric("ms", "lower", "99th percentile of the same"),
    "executor_heartbeat_max_s": Metric(
        "s",
        "lower",
        "longest heartbeat() call, counting one still running when the measurement ended",
    ),
    "job_heartbeat_max_gap_s": Metric(
        "s",
        "lower",
        "longest gap between successive scheduler job heartbeats (job.latest_heartbeat, written about "
        "once a second while the scheduler loop turns), counting the open gap at the end; every beat, "
        "as a trigger in the database records it",
    ),
    "job_heartbeat_max_gap_sampled_s": Metric(
        "s",
        "lower",
        "the same from the suite's samples of latest_heartbeat alone, every 0.5 s (how it was measured "
        "before the database recorded every beat): a sampler kept off the CPU misses beats, and two gaps "
        "read as one",
    ),
}

# A word, not a number (the record's "text"); the report shows it beside the numbers.
_RUN_STATE: Final[Metric] = Metric(
    "",
    "none",
    "state of the DAG run at the end: success or failed, else what it still was when the run was "
    "abandoned (running, queued)",
    word=True,
)

METRICS: Final[dict[str, dict[str, Metric]]] = {
    "throughput": {
        "makespan_s": Metric("s", "lower", "first task start to last task end (task_instance rows)"),
        "run_duration_s": Metric("s", "lower", "trigger (dag_run.queued_at) to DAG run end"),
        "tasks_per_s": Metric("1/s", "higher", "tasks divided by makespan_s"),
        "queued_to_start_p50_s": Metric(
            "s", "lower", "median of start_date - queued_dttm over the task instances"
        ),
        "queued_to_start_p95_s": Metric("s", "lower", "95th percentile of the same"),
        "tasks_succeeded": Metric("", "higher", "task instances that ended in success"),
        **_LOOP,
        **_CPU,
    },
    "footprint": {
        "idle_uss_mb": Metric(
            "MB", "lower", "USS summed over the scheduler tree, median of the idle window (no DAG run)"
        ),
        "idle_pss_mb": Metric("MB", "lower", "PSS summed the same way, idle window"),
        "idle_scheduler_pss_mb": Metric(
            "MB",
            "lower",
            "PSS of the scheduler process alone, idle window: the floor for any executor that lives in it",
        ),
        "idle_processes": Metric("", "lower", "processes in the scheduler tree while idle"),
        "busy_uss_mb": Metric(
            "MB", "lower", "scheduler-tree USS, median while the most tasks were running at once"
        ),
        "busy_pss_mb": Metric("MB", "lower", "scheduler-tree PSS over the same samples"),
        "peak_uss_mb": Metric("MB", "lower", "highest scheduler-tree USS sample of the run"),
        "peak_running": Metric(
            "", "higher", "most task instances in state running at once (launch rate bounds it)"
        ),
        "per_task_uss_mb": Metric("MB", "lower", "(busy_uss_mb - idle_uss_mb) / peak_running"),
        "per_task_pss_mb": Metric("MB", "lower", "(busy_pss_mb - idle_pss_mb) / peak_running"),
        "queued_to_start_p50_s": Metric(
            "s", "lower", "median of each task's start_date - queued_dttm (all tasks start at once)"
        ),
        "queued_to_start_p95_s": Metric("s", "lower", "95th percentile of the same"),
        **_CPU,
    },
    "burst": {
        "run_state": _RUN_STATE,
        "tasks_succeeded": Metric("", "higher", "task instances in success at the end (final states)"),
        "tasks_failed": Metric("", "lower", "task instances in failed or up_for_retry at the end"),
        "tasks_lost": Metric(
            "", "lower", "task instances not finished when the run was abandoned (stuck queued/running)"
        ),
        "makespan_s": Metric(
            "s",
            "lower",
            "trigger to the DAG run's end (dag_run.end_date), or to the moment the run was abandoned "
            "(stall or timeout)",
        ),
        "run_finished": Metric("", "higher", "1 when the DAG run reached a final state in time"),
        "first_running_s": Metric(
            "s", "lower", "trigger to the first task instance seen running (the clear schedule starts there)"
        ),
        "clears": Metric("", "none", "clears of every task instance of the run that the REST API accepted"),
        "clear_call_max_s": Metric(
            "s", "lower", "longest clearTaskInstances call (the api-server's answer time under the burst)"
        ),
        "tries": Metric("", "none", "sum of try_number over the task instances: how many times tasks ran"),
        "state_mismatches": Metric(
            "",
            "none",
            "scheduler log lines 'but the task instance's state attribute is' (an executor event that "
            "contradicts the database); clearing running task instances causes some by design, so this is "
            "context, not a fault count",
        ),
        **_LOOP,
        "job_heartbeat_stalls": Metric(
            "", "lower", "gaps of more than 5 s between scheduler job heartbeats (loop stalls)"
        ),
        "job_heartbeat_stalled_s": Metric("s", "lower", "total length of those gaps"),
        "scheduler_main_thread_cpu_s": Metric(
            "s", "lower", "CPU of the scheduler's own thread (its loop, where the heartbeat is written)"
        ),
        "scheduler_other_threads_cpu_s": Metric(
            "s",
            "lower",
            "CPU of every other thread of the scheduler process (the executor's loop thread and its "
            "helpers; comparable across versions that did not name the loop thread)",
        ),
        "executor_loop_thread_cpu_s": Metric(
            "s",
            "lower",
            "CPU of this executor's event-loop thread in the scheduler process (kernel name ale-loop); "
            "stock has none",
        ),
        **_CPU,
        **_ROLES,
    },
    "dispatch": {
        "heartbeat_p50_ms": Metric("ms", "lower", "median heartbeat() duration with K workloads queued"),
        "heartbeat_p99_ms": Metric("ms", "lower", "99th percentile of the same"),
        "heartbeat_max_ms": Metric(
            "ms", "lower", "longest heartbeat() call, the blocked one included (it ran until the timeout)"
        ),
        "heartbeats": Metric("", "none", "heartbeat() calls that returned within the window"),
        "dispatched": Metric(
            "",
            "none",
            "workloads handed to the executor's workers (K minus what is still in queued_tasks); "
            "AsyncLocalExecutor stops at parallelism plus its prefetch because it keeps `running`",
        ),
        "blocked": Metric("", "lower", "1 when a heartbeat() call did not return within the block limit"),
        "blocked_after_dispatched": Metric(
            "", "none", "workloads dispatched before the heartbeat that blocked (empty if none blocked)"
        ),
    },
    "ordinary": {
        "run_state": _RUN_STATE,
        "tasks_succeeded": Metric("", "higher", "task instances in success at the end (final states)"),
        "tasks_failed": Metric(
            "",
            "lower",
            "task instances in failed, up_for_retry or upstream_failed at the end; a task that succeeded and "
            "was then failed by the scheduler counts here",
        ),
        "tasks_lost": Metric("", "lower", "task instances in no final state when the run ended or timed out"),
        "state_mismatches": Metric(
            "",
            "lower",
            "scheduler log lines 'but the task instance's state attribute is': the executor reported a task "
            "finished while the database held another state, which the scheduler resolves by failing it",
        ),
        "makespan_s": Metric("s", "lower", "first task start to last task end (task_instance rows)"),
        "run_duration_s": Metric("s", "lower", "trigger (dag_run.queued_at) to DAG run end"),
        "tries": Metric(
            "", "none", "sum of try_number over the task instances (the number of tasks when none ran twice)"
        ),
        **_LOOP,
        **_CPU,
        **_ROLES,
    },
    "imports": {
        "makespan_s": Metric("s", "lower", "first task start to last task end (task_instance rows)"),
        "run_duration_s": Metric("s", "lower", "trigger (dag_run.queued_at) to DAG run end"),
        "task_duration_p50_s": Metric(
            "s",
            "lower",
            "median of end_date - start_date over the task instances: the task process's parse of its DAG "
            "file (the file's imports) and the task's own run, imports in its body included",
        ),
        "task_duration_p95_s": Metric("s", "lower", "95th percentile of the same"),
        "tasks_succeeded": Metric("", "higher", "task instances that ended in success"),
        "idle_uss_mb": Metric(
            "MB", "lower", "USS summed over the scheduler tree, median of an idle window before the trigger"
        ),
        "busy_uss_mb": Metric(
            "MB", "lower", "scheduler-tree USS, median while the most tasks were running at once"
        ),
        "busy_pss_mb": Metric("MB", "lower", "scheduler-tree PSS over the same samples"),
        "peak_uss_mb": Metric("MB", "lower", "highest scheduler-tree USS sample of the run"),
        "peak_running": Metric("", "higher", "most task instances in state running at once"),
        "per_task_uss_mb": Metric(
            "MB",
            "lower",
            "(busy_uss_mb - idle_uss_mb) / peak_running: what each running task added to the scheduler "
            "tree, its imports included",
        ),
        "per_task_pss_mb": Metric(
            "MB", "lower", "the same with PSS (the idle window's PSS median subtracted)"
        ),
        "task_process_uss_mb": Metric(
            "MB",
            "lower",
            "median over the tasks of the private memory (USS) of the process that runs the task's code, "
            "read by the task itself when it runs (its DAG file parsed, its imports done); the worker or "
            "supervisor beside it is not in it (per_task_uss_mb counts both)",
        ),
        "task_process_uss_p95_mb": Metric("MB", "lower", "95th percentile of the same"),
        **_CPU,
    },
    "starvation": {
        "run_state": _RUN_STATE,
        "tasks_succeeded": Metric(
            "", "higher", "task instances in success at the end: the crowd, long_cpu, cpu_a and cpu_b"
        ),
        "long_cpu_wall_s": Metric(
            "s",
            "lower",
            "end_date - start_date of long_cpu, the CPU task that started while the crowd ran: its fixed "
            "CPU work over the share of the CPU it got, during the crowd and after it",
        ),
        "cpu_tasks_wall_s": Metric(
            "s",
            "none",
            "median end_date - start_date of cpu_a and cpu_b, the same CPU work started after the crowd "
            "ended (what long_cpu competes with)",
        ),
        "long_cpu_stretch": Metric(
            "",
            "lower",
            "long_cpu_wall_s over the CPU seconds it burns: 1 is a core of its own all along, 1.5 two "
            "thirds of a core (a fair share of 2 cores with cpu_a and cpu_b) all along; far above that, "
            "it was starved",
        ),
        "crowd_running_at_long_cpu_start": Metric(
            "",
            "none",
            "crowd task instances running (start <= long_cpu's start < end) when long_cpu started: "
            "more than 24 per core makes it a start in a crowd, which the case is there to test",
        ),
        "crowd_peak_running": Metric("", "none", "most crowd task instances running at once (from the rows)"),
        "makespan_s": Metric("s", "lower", "first task start to last task end (task_instance rows)"),
        "run_duration_s": Metric("s", "lower", "trigger (dag_run.queued_at) to DAG run end"),
        **_LOOP,
        **_CPU,
    },
    "restart": {
        "run_state": _RUN_STATE,
        "old_scheduler_exit_s": Metric(
            "s",
            "none",
            "the signal to the old scheduler's exit (empty if it had to be SIGKILLed after exit_timeout): "
            "how long a stop takes, which is also how long no scheduler runs",
        ),
        "old_scheduler_exit_code": Metric(
            "", "none", "the old scheduler's exit status (-9: killed by SIGKILL, 0: a clean stop)"
        ),
        "tasks_succeeded": Metric("", "higher", "task instances in success at the end (final states)"),
        "tasks_failed": Metric(
            "", "lower", "task instances in failed, up_for_retry or upstream_failed at the end"
        ),
        "tasks_rerun": Metric(
            "",
            "lower",
            "task instances whose final try_number is above 1: they ran again after the restart",
        ),
        "executions": Metric(
            "", "lower", "executions the tasks recorded (one per task process that started the task's code)"
        ),
        "executions_killed": Metric(
            "",
            "lower",
            "executions that started and never recorded an end: killed part-way (by a stop, a kill, or "
            "Airflow once their try was reset)",
        ),
        "tasks_ran_twice_at_once": Metric(
            "",
            "lower",
            "task instances with two executions running at the same time (from the executions' files and "
            "the benchmark's watch of their processes): a try that went on running after its scheduler "
            "died while the next scheduler ran the task instance again",
        ),
        "ran_twice_overlap_max_s": Metric(
            "s", "lower", "the longest time two executions of one task instance ran at the same time"
        ),
        "executions_running_at_signal": Metric(
            "", "none", "executions running when the signal was sent (every task, once all have started)"
        ),
        "executions_alive_at_run_end": Metric(
            "",
            "lower",
            "executions whose process still ran when the DAG run ended (orphans; the teardown kills them)",
        ),
        "restart_to_run_end_s": Metric("s", "lower", "the new scheduler's start to the DAG run's end"),
        "makespan_s": Metric(
            "s",
            "lower",
            "the first task's start (its execution's file) to the DAG run's end (dag_run.end_date)",
        ),
    },
    "control": {
        "tasks_succeeded": Metric("", "higher", "task instances that ended success"),
        "tasks_failed": Metric(
            "", "none", "task instances that ended failed (a terminate drain's on purpose)"
        ),
        "task_instances_run_twice": Metric("", "lower", "task instances with more than one execution"),
        "started_while_held": Metric("", "lower", "pause: executions that started while the pause held"),
        "queued_while_paused": Metric(
            "",
            "lower",
            "pause: most task instances queued or running at once while paused (sampled every 1 s)",
        ),
        "requeued_stuck_in_queued": Metric(
            "",
            "lower",
            "pause: 'Task stuck in queued' lines in the scheduler log (a revoke and requeue each)",
        ),
        "resume_to_run_end_s": Metric("s", "lower", "pause: from the resume command to the DAG run's end"),
        "drain_s": Metric(
            "s", "none", "drain: from the drain command to drained, or to its deadline passing"
        ),
        "drain_overdue": Metric("", "none", "drain: 1 when the deadline passed with tasks still running"),
        "named_at_deadline": Metric("", "none", "drain: tasks the command named as running at its deadline"),
        "starts_over_limit": Metric(
            "",
            "lower",
            "resize: status samples (every 0.25 s) where the running count grew past the limit in force",
        ),
        "peak_running_first_limit": Metric("", "none", "resize: most running under the first limit"),
        "peak_running_raised": Metric("", "none", "resize: most running once raised"),
        "peak_running_lowered": Metric(
            "", "none", "resize: most running once lowered, from when the count first fell to the limit"
        ),
    },
    "chaos": {
        "seed": Metric(
            "", "none", "the seed the sequences were drawn from (ALE_CHAOS_SEED replays it)", word=True
        ),
        "sequences": Metric("", "none", "sequences played (one DAG run each)"),
        "sequences_failed": Metric("", "lower", "sequences that broke at least one invariant"),
        "violations": Metric(
            "", "lower", "invariant violations over all sequences, one per task instance and rule broken"
        ),
        "seconds_per_sequence": Metric("s", "none", "median time of one sequence, trigger to its checks"),
        "executions": Metric("", "none", "executions the tasks recorded (one per start of a task's code)"),
        "task_instances_run_twice": Metric(
            "",
            "lower",
            "task instances whose code started more than once (handover_timeout without a live owner explains "
            "some: their workload killed itself, unadopted, and the next try ran)",
        ),
        "gaps_over_handover_timeout": Metric(
            "", "none", "times no scheduler ran for longer than handover_timeout (a step's choice)"
        ),
        "crowded_sequences": Metric(
            "",
            "none",
            "sequences in which an executor ran its crowd threshold of workloads at once, or started a "
            "crowd of starts",
        ),
        "peak_running": Metric("", "none", "the most executions running at once, over all sequences"),
        "sigterm_exit_max_s": Metric("s", "lower", "the longest a SIGTERM'd scheduler took to exit"),
    },
}


def metric(scenario: str, name: str) -> Metric:
    return METRICS.get(scenario, {}).get(name, Metric("", "none", ""))
