"""Every ``[async_local_executor]`` option described once: its type, default, example and meaning.

The provider info, ``airflow config list``, the configuration reference and the parsing in
:mod:`~async_local_executor.adapter.config` all derive from :data:`OPTIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SECTION = "async_local_executor"


@dataclass(frozen=True)
class OptionDoc:
    """One option, described once: the provider info, ``airflow config list`` and the reference derive from it."""

    name: str
    type: Literal["string", "integer", "float", "boolean"]
    default: str
    example: str
    description: str
    version_added: str = "0.1.0"


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc(
        "shutdown_timeout",
        "float",
        "60",
        "120",
        "With on_stop = terminate: seconds end() (scheduler shutdown on SIGTERM/SIGINT) waits for "
        "running workloads to finish before terminating them. With on_stop = handover: how long it "
        "waits for the workloads it cannot hand over (being stopped, or on a kernel without pidfd).",
    ),
    OptionDoc(
        "on_stop",
        "string",
        "handover",
        "terminate",
        "What a scheduler stop (SIGTERM/SIGINT) does to running tasks. handover: they run on, recorded "
        "for the next scheduler on this host, which adopts them (and reports their end); end() returns "
        "within seconds. terminate: end() waits shutdown_timeout for them, then terminates them, and "
        "the next scheduler resets their task instances.",
    ),
    OptionDoc(
        "handover_timeout",
        "float",
        "300",
        "900",
        "Seconds a running task waits, after its scheduler stopped or died, for another scheduler on "
        "this host to adopt it; past that it kills itself and everything it started. 0: a task dies "
        "with its scheduler at once, and on_stop = handover acts as terminate.",
    ),
    OptionDoc(
        "termination_grace_period",
        "float",
        "10",
        "30",
        "Seconds between SIGTERM and SIGKILL when a workload's process group is terminated. A task "
        "handed over while it was being stopped for its task_timeout gets only what was left of it then, "
        "counted on since: the next scheduler does not grant it again (none left: SIGKILL at once).",
    ),
    OptionDoc("event_loop", "string", "auto", "uvloop", "auto (uvloop when installed), asyncio or uvloop."),
    OptionDoc(
        "launcher",
        "string",
        "forkserver",
        "subprocess",
        "How a workload becomes a process: forkserver (a helper that imported Airflow once forks each "
        "workload: milliseconds per launch) or subprocess (a fresh interpreter per workload: about 1.5 "
        "to 2 s of CPU per launch).",
    ),
    OptionDoc(
        "forkserver_idle_timeout",
        "float",
        "0",
        "300",
        "0: the fork server starts with the executor and stays. A number of seconds: it starts with "
        "the first workload and exits after that long with no workload running, giving back its "
        "memory (about 125 MB) on an idle host; the next workload then waits for a new one to start "
        "(2 to 3 s).",
    ),
    OptionDoc(
        "task_timeout",
        "float",
        "0",
        "3600",
        "Seconds a task's process may run before the executor terminates it (SIGTERM, then SIGKILL "
        "after termination_grace_period), as a backstop for execution_timeout (which the task enforces "
        "itself, and cannot when it hangs in C code or ignores signals). 0: no limit. A task overrides "
        'it with executor_config={"async_local_executor": {"task_timeout": SECONDS}}; an invalid value '
        "fails that task, unlaunched, with the reason.",
    ),
    OptionDoc(
        "queue_limits",
        "string",
        "",
        "reports:4,default:28",
        "Per-queue limits on running tasks, as queue:N pairs (a task's queue is its operator's queue "
        "argument). A task held back by its queue's limit does not hold one of parallelism's slots. "
        "Queues not listed are limited by parallelism alone.",
    ),
    OptionDoc(
        "min_available_memory_mb",
        "float",
        "256",
        "1024",
        "While the host's available memory (MemAvailable) is below this many MB, workloads wait to "
        "launch (they do not fail), with one warning in the scheduler log when that starts and one "
        "when it ends. 0 turns the guard off.",
    ),
    OptionDoc(
        "prefetch_multiplier",
        "float",
        "1",
        "0.5",
        "Workloads the executor accepts beyond parallelism, as a multiple of parallelism. They wait "
        "in the executor (state queued) and start the moment a slot frees, instead of one scheduler "
        "loop later; the number of running workloads never exceeds parallelism. 0 accepts only as "
        "many as there are free slots. Lower it when several executors share the work, so none holds "
        "tasks another could start. The executor lowers it itself while tasks run long enough for a "
        "waiting one to reach [scheduler] task_queued_timeout.",
    ),
    OptionDoc(
        "health_loop_lag_limit",
        "float",
        "1",
        "2",
        "get_health() reports unhealthy while the event loop has woken more than this many seconds "
        "late in the last 10 s (a late loop delays every launch and every exit it reports).",
    ),
    OptionDoc(
        "health_wait_limit",
        "float",
        "600",
        "1800",
        "get_health() reports unhealthy while a workload has waited longer than this many seconds "
        "for a slot, a queue limit or memory.",
    ),
    OptionDoc(
        "state_dir",
        "string",
        "",
        "/var/lib/airflow/async_local_executor",
        "Where each executor keeps its journal of running launches (pid, process start time, task) "
        "and its status file, 0600 in a 0700 directory. A scheduler that starts kills what a crashed "
        "one left running, found through these journals, before it launches anything. Empty: "
        "{AIRFLOW_HOME}/async_local_executor.",
    ),
    OptionDoc(
        "workload_cpu_priority",
        "string",
        "auto",
        "idle",
        "CPU priority of each workload process (and all it starts) against the scheduler, the "
        "api-server and the dag-processor. auto: the scheduler's own priority, except for a workload "
        "that starts in a crowd, while 24 or more per CPU core run or after 8 per core started within "
        "the last half second: it gets the lowest CPU share (its cgroup's CPU weight, or SCHED_IDLE where it "
        "can be left again) until fewer run and fewer start, so a burst of task starts "
        "cannot starve the scheduler's loop and no task stays slowed after the burst. idle: Linux "
        "SCHED_IDLE for every workload, for its life (tasks get every cycle Airflow's processes do not "
        "want; the scheduler then loops more often and ordinary throughput drops). A nice increment "
        "from 1 to 19. normal: the scheduler's own priority, as the stock LocalExecutor runs tasks.",
    ),
    OptionDoc(
        "preload",
        "string",
        "auto",
        "explicit",
        "What the fork server imports before forking, beyond what every task needs. auto: it learns what "
        "tasks import (the top-level imports of their DAG files, read without running them, and the "
        "modules their processes loaded while they ran), and a new fork server preloads those of "
        "installed distributions, replacing the old one without stopping any task, at most once per "
        "preload_interval; never a module of the DAGs folder or a bundle (so an edited DAG file takes "
        "effect on the next task), one that fails to import, or one that starts a thread; "
        "preload_modules too. explicit: only preload_modules. off: nothing beyond what every task needs "
        "(preload_modules is ignored). The status command lists what is preloaded and what was refused.",
    ),
    OptionDoc(
        "preload_modules",
        "string",
        "",
        "pandas,numpy",
        "Comma-separated modules the fork server always imports before forking (with preload = auto or "
        "explicit), such as heavy libraries your DAGs use, so every task shares them instead of "
        "importing them again. A module that fails to import is logged and skipped; one that starts a "
        "thread stops the fork server (every workload then starts a fresh interpreter).",
    ),
    OptionDoc(
        "preload_exclude",
        "string",
        "",
        "boto3,mycompany.heavy",
        "Comma-separated modules (each with its submodules) preload = auto never preloads, for a library "
        "that misbehaves when imported before a fork.",
    ),
    OptionDoc(
        "preload_memory_budget",
        "string",
        "1GiB",
        "512MiB",
        "How much the fork server's memory may grow by for learned modules (bytes, or with a K, M, G "
        "or T suffix, powers of 1024). Modules learned beyond it are refused, and the status command "
        "says so. The fork server's pages are shared by every task forked from it, so this is paid once per "
        "fork server, not per task. When the learned set grows a new fork server takes over and the old "
        "one exits at once, but the pages its tasks still run on stay until the last of them ends: for "
        "that while, both sets are in memory.",
    ),
    OptionDoc(
        "preload_interval",
        "float",
        "60",
        "300",
        "Seconds at least between two fork servers started because tasks imported something new or a "
        "preloaded distribution was upgraded (pip install -U). The first starts as soon as there is "
        "something to preload. Each start costs the fork server's own imports (about 2 s of CPU).",
    ),
    OptionDoc(
        "containment",
        "string",
        "auto",
        "off",
        "auto: each workload runs in a cgroup of its own where the host allows it (cgroup2 mounted, "
        "and the scheduler's cgroup delegated to it, for example systemd Delegate=yes, or cgroup_root "
        "set), so nothing a task starts can escape its end, a stop or a restart's reclaim, and the "
        "limits below can be enforced; elsewhere the executor says once at start why not and tracks "
        "processes by group and environment marker as before. off: never create cgroups.",
    ),
    OptionDoc(
        "cgroup_root",
        "string",
        "",
        "/airflow-tasks",
        "A cgroup2 path (relative to the cgroup2 mount) to create the executor's cgroups under, made if "
        "missing, instead of the scheduler's own cgroup. Use it where the scheduler's cgroup is not "
        "delegated but another one is. A root that cannot be used stops the executor at start.",
    ),
    OptionDoc(
        "task_memory_limit",
        "string",
        "",
        "2GiB",
        "Memory each task's cgroup may use: bytes, or with a K, M, G or T suffix (powers of 1024; "
        "512M, 512MiB and 512MB are the same), "
        "swap included where the host accounts it. The kernel kills a task over it; the task fails "
        "with the reason (killed by the kernel: memory limit ... exceeded), and nothing else is "
        "touched. Empty: no limit. A task sets its own with "
        'executor_config={"async_local_executor": {"task_memory_limit": "512MiB"}}. Needs the memory '
        "controller: without it the executor refuses to start (this option) or fails the task, "
        "unlaunched (a task's own).",
    ),
    OptionDoc(
        "task_cpu_limit",
        "string",
        "",
        "1.5",
        "CPUs each task's cgroup may use (a number, e.g. 0.5 or 2). Empty: no limit. Per task and "
        "without the cpu controller: as task_memory_limit.",
    ),
    OptionDoc(
        "task_pids_limit",
        "string",
        "",
        "512",
        "Processes and threads each task's cgroup may hold at once (stops a fork bomb). Empty: no "
        "limit. Per task and without the pids controller: as task_memory_limit.",
    ),
    OptionDoc(
        "kill_leftover_processes",
        "boolean",
        "True",
        "False",
        "When a task's main process exits, kill whatever is left in its cgroup (processes it started "
        "and did not wait for, as systemd's KillMode=control-group does) and say how many in the "
        "scheduler log. False leaves them running until the scheduler stops; a scheduler that starts "
        "after a crash kills them either way. Only with containment.",
    ),
)
