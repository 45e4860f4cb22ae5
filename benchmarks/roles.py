"""Where each task's CPU goes, by role: the scheduler's threads, the fork server, the workload process,
the task process, the api-server and the dag-processor.

The processes that run a task are short-lived: by the end of a run most have exited, and a process's
CPU time then survives only folded into its reaper's ``children`` times, with its children's. So the
account reads, over the measured phase:

- for processes still alive at its end, their own CPU time and that of the children they reaped
  (``/proc``), less what they had at its start; the scheduler's threads one by one
  (``/proc/<pid>/task``);
- for the children the scheduler reaped, the exact total of each subtree from the scheduler's own
  ``children`` times, split between the roles by the kernel's exit records
  (:mod:`benchmarks.taskstats`: one per exited process, with its pid, its parent's pid and its threads'
  run time as the scheduler counted it). A record is written as the process begins to exit, before its
  address space is torn down: the records give the time of the processes below the scheduler's
  children (task processes, under this executor), and what is left of the exact total goes to those
  children. That rest holds every exit's own work in the subtree, the task process's too (reported
  apart as :data:`EXITS`): under this executor the workload process's figure counts its task
  process's exit, and the task process's figure lacks it. Under the stock executor both are exact (its
  long-lived workers reap their task processes, and never exit in between).

The records need root (``CAP_NET_ADMIN`` in the host's namespaces); runs side by side each have them.
A run that cannot have them reports no role figures, and says why in its notes. Nothing samples the
processes in between (on a burst's hundreds of processes that would take a share of the cores the run
is measured on): the records carry each exited process's parent, in exit order.

A process's role is where it hangs below the scheduler: a fork-server helper (the pids its log names
as ready) and whatever it forks for itself; a workload (any other child of the scheduler that is not
one of Airflow's own: this executor's workload process, the entry process that runs Airflow's task
supervisor in itself, or stock's worker, which is Airflow's supervisor alone); below a workload, the
task process and whatever it starts. The api-server and the dag-processor are measured as whole
process trees. What the scheduler's tree used and no role accounts for is reported too, signed (a
process re-parented away from it, say), so that the roles can be checked against the tree's total.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psutil

from async_local_executor.core.runtime import THREAD_NAME as LOOP_THREAD
from benchmarks import taskstats
from benchmarks.probes import thread_cpu_seconds, tree, tree_cpu_seconds
from benchmarks.scheduler_profile import thread_times

# The roles, in the order the charts stack them: Airflow's processes first, then the executor's own.
ROLES: Final[tuple[str, ...]] = (
    "scheduler_thread",
    "scheduler_other_threads",
    "scheduler_other_children",
    "api_server",
    "dag_processor",
    "task_process",
    "workload",
    "loop_thread",
    "fork_server",
    "unattributed",
)
# The roles of the scheduler's process tree (the others are the api-server's and the dag-processor's).
SCHEDULER_TREE: Final[tuple[str, ...]] = tuple(r for r in ROLES if r not in ("api_server", "dag_processor"))
LABELS: Final[Mapping[str, str]] = {
    "scheduler_thread": "scheduler thread",
    "scheduler_other_threads": "scheduler's other threads",
    "scheduler_other_children": "scheduler's other children (log server; Airflow 2: DAG processor)",
    "api_server": "api-server",
    "dag_processor": "dag-processor",
    "task_process": "task process",
    "workload": "workload process (stock: Airflow's supervisor; ours: entry + supervisor)",
    "loop_thread": "executor loop thread",
    "fork_server": "fork server",
    "unattributed": "scheduler tree, unattributed",
}


def metric(role: str) -> str:
    """The figure's name for ``role``'s CPU per task."""
    return f"cpu_per_task_{role}_s"


_READY: Final = re.compile(r"fork server ready \(pid (\d+)")
# The title a workload process takes: this executor's (adapter/startup.py) and stock's worker.
WORKLOAD_TITLE: Final = "airflow worker --"
# The part of the reaped subtrees' exact total that no record holds: the exits' teardowns (see above).
EXITS: Final = "cpu_per_task_exits_s"

Exited = taskstats.ExitedProcess


def helper_pids(scheduler_log: str) -> set[int]:
    """The pids of the fork-server helpers a scheduler log names as ready."""
    return {int(pid) for pid in _READY.findall(scheduler_log)}


class AccountingUnavailable(Exception):
    """The kernel's records cannot be had for this run (the message says why)."""


@contextlib.contextmanager
def _records() -> Iterator[taskstats.Listener]:
    """The kernel's exit records for the block."""
    if os.geteuid() != 0:
        raise AccountingUnavailable("the kernel's exit records (taskstats) need root")
    try:
        with taskstats.Listener().listening() as listener:
            yield listener
    except taskstats.TaskstatsUnavailable as exc:
        raise AccountingUnavailable(str(exc)) from None


@dataclass
class _Seen:
    ppid: int
    cmdline: str


@dataclass(frozen=True)
class _Times:
    own: float  # user + system
    children: float  # of the children it reaped, with what they had reaped
    # Its live threads' run time, as an exit record counts it (the threads that ended before are in
    # ``own`` and in no record): what a record of its exit holds of its life before the phase.
    threads: float = 0.0


def _times(proc: psutil.Process) -> _Times:
    t = proc.cpu_times()
    threads = sum(thread.cpu_s for thread in thread_times(proc.pid).values())
    return _Times(float(t.user + t.system), float(t.children_user + t.children_system), threads)


def _scheduler_times(pid: int) -> _Times | None:
    try:
        return _times(psutil.Process(pid))
    except psutil.Error:
        return None


@dataclass(frozen=True)
class _Phase:
    """What was read at the phase's two ends, and the kernel's records of what exited in between."""

    before: Mapping[int, _Times]
    after: Mapping[int, _Times]
    exited: list[Exited]
    scheduler_before: _Times
    scheduler_after: _Times


@dataclass
class RoleAccount:
    """CPU seconds by role over one measured phase of a deployment (see the module docstring).

    :param scheduler: the scheduler's pid
    :param others: the api-server's and the dag-processor's pids, by role
    :param scheduler_log: the scheduler's log, which names each fork-server helper's pid
    """

    scheduler: int
    others: Mapping[str, int]
    scheduler_log: Path
    seconds: dict[str, float] = field(default_factory=dict)
    exits: float = 0.0  # of the scheduler's children's figures, what is exits' teardowns (EXITS)
    unavailable: str | None = None
    _seen: dict[int, _Seen] = field(default_factory=dict)

    def _look(self) -> dict[int, _Times]:
        """CPU times of every live descendant of the scheduler; notes who is whose child and what each
        calls itself (for the processes that exit, the kernel's records say so)."""
        found = {}
        for proc in tree(self.scheduler)[1:]:
            with contextlib.suppress(psutil.Error):
                self._seen[proc.pid] = _Seen(proc.ppid(), " ".join(proc.cmdline()))
                found[proc.pid] = _times(proc)
        return found

    @contextlib.contextmanager
    def measuring(self) -> Iterator[RoleAccount]:
        """Account the block; :attr:`seconds` holds the figures after it (empty, with
        :attr:`unavailable` set, when the kernel's records could not be had, or were not all had)."""
        with contextlib.ExitStack() as stack:
            try:
                listener = stack.enter_context(_records())
            except AccountingUnavailable as exc:
                self.unavailable = str(exc)
                yield self
                return
            before = self._look()
            threads_before = thread_cpu_seconds(self.scheduler)
            scheduler_before = _scheduler_times(self.scheduler)
            trees_before = {role: tree_cpu_seconds(pid) for role, pid in self.others.items()}
            try:
                yield self
            finally:
                after = self._look()
                threads_after = thread_cpu_seconds(self.scheduler)
                scheduler_after = _scheduler_times(self.scheduler)
                trees_after = {role: tree_cpu_seconds(pid) for role, pid in self.others.items()}
        # Read once the listener stopped: it has every record the kernel sent by then.
        if listener.lost is not None:
            self.unavailable = listener.lost
            return
        if listener.timeless:
            self.unavailable = "the kernel's exit records carry no run time (CONFIG_TASK_DELAY_ACCT off)"
            return
        if not threads_after or scheduler_after is None or scheduler_before is None:
            self.unavailable = "the scheduler was gone by the end of the phase"
            return
        self.seconds = self._account(
            _Phase(before, after, listener.exited(), scheduler_before, scheduler_after),
            threads_before,
            threads_after,
            {role: trees_after[role] - trees_before[role] for role in self.others},
        )

    def _helpers(self) -> set[int]:
        try:
            text = self.scheduler_log.read_text(errors="replace")
        except OSError:
            return set()
        return helper_pids(text)

    def _account(
        self,
        phase: _Phase,
        threads_before: Mapping[str, float],
        threads_after: Mapping[str, float],
        trees: Mapping[str, float],
    ) -> dict[str, float]:
        seconds = dict.fromkeys(ROLES, 0.0)
        own = phase.scheduler_after.own - phase.scheduler_before.own
        main = threads_after.get("main", 0.0) - threads_before.get("main", 0.0)
        loop = threads_after.get(LOOP_THREAD, 0.0) - threads_before.get(LOOP_THREAD, 0.0)
        seconds["scheduler_thread"] = main
        seconds["loop_thread"] = loop
        # Threads that ended during the phase count in the process's own time only.
        seconds["scheduler_other_threads"] = own - main - loop
        seconds.update(trees)
        before, after, exited = phase.before, phase.after, phase.exited
        helpers = self._helpers()
        earlier = set(before)
        # The records are in exit order, and a pid may have been reused: a record's parent is the next
        # record of that pid after it, if any, else the live process (or the scheduler) of that pid.
        later: dict[int, list[int]] = {}
        for index, record in enumerate(exited):
            later.setdefault(record.pid, []).append(index)

        def exited_line(index: int) -> list[int]:
            """The record at ``index`` and its ancestors' that exited too, nearest first."""
            line = [index]
            while True:
                after_it = later.get(exited[line[-1]].ppid, [])
                found = bisect.bisect_right(after_it, line[-1])
                if found == len(after_it):
                    return line
                line.append(after_it[found])

        parents = {pid: seen.ppid for pid, seen in self._seen.items()}

        def role_of(pid: int, line: list[int]) -> str | None:
            # Its exited ancestors by record, then the live ones by pid.
            known = collections.ChainMap({exited[i].pid: exited[i].ppid for i in line}, parents)
            return self._role(pid, known, helpers, earlier)

        def below(role: str) -> str:
            # What a process of ``role`` starts: a workload's children are its task process.
            return "task_process" if role == "workload" else role

        # Live processes: their own time from /proc, and that of the children they reaped, exactly.
        live_roles: dict[int, str] = {}
        for pid, now in after.items():
            if (role := role_of(pid, [])) is None:
                continue
            live_roles[pid] = role
            was = before.get(pid, _Times(0.0, 0.0))
            seconds[role] += now.own - was.own
            seconds[below(role)] += now.children - was.children
        # What the scheduler reaped (its children that exited, with everything they had reaped) is exact
        # too, as is what a live process reaped. Each exited process sits in the total of its nearest
        # ancestor that did not exit (its reaper's, if that one lives), less what it had used before
        # the phase. Inside what the scheduler reaped, only the kernel's records tell the parts apart,
        # and they hold no exit's own work (its teardown): the records give the time of each exited
        # process below the scheduler's children, and what is left of the exact total goes to those
        # children, by role, in proportion to their records; what is left beyond their records is
        # the exits' work (``exits``).
        reaped = phase.scheduler_after.children - phase.scheduler_before.children
        tops: dict[str, float] = {}
        for index, record in enumerate(exited):
            if record.pid in after:
                continue
            line = exited_line(index)
            role = role_of(record.pid, line)
            if role is None:
                continue
            prior = before.get(record.pid, _Times(0.0, 0.0))
            reaper = exited[line[-1]].ppid
            if reaper != self.scheduler:
                if reaper in live_roles:  # in that live process's children time: only its past is out
                    seconds[below(live_roles[reaper])] -= prior.own + prior.children
                continue
            reaped -= prior.own + prior.children
            cpu = record.cpu_s - prior.threads
            if len(line) == 1:  # a child of the scheduler's own
                tops[role] = tops.get(role, 0.0) + cpu
            else:
                seconds[role] += cpu
                reaped -= cpu
        # Processes of the start that exited before the records did (zombies then): their whole life is in
        # their reaper's children time, and in no record.
        recorded = {record.pid for record in exited}
        for pid, prior in before.items():
            if pid in after or pid in recorded:
                continue
            parent = parents.get(pid)
            if parent == self.scheduler:
                reaped -= prior.own + prior.children
            elif parent is not None and parent in live_roles:
                seconds[below(live_roles[parent])] -= prior.own + prior.children
        counted = sum(tops.values())
        # What no record holds: each exit's teardown, below the scheduler's children and of their own.
        # Signed: the reaper's times count 10 ms units, so a few exits may come out a little below zero.
        self.exits = reaped - counted if tops else 0.0
        for role, cpu in tops.items():
            seconds[role] += reaped * cpu / counted if counted > 0 else reaped / len(tops)
        if not tops:
            seconds["unattributed"] += reaped

        # The tree's total, as tree_cpu_seconds counts it, less every role of the tree: signed, so that
        # an account that counted too much shows it.
        def total(scheduler: _Times, live: Mapping[int, _Times]) -> float:
            return scheduler.own + scheduler.children + sum(t.own + t.children for t in live.values())

        tree_total = total(phase.scheduler_after, after) - total(phase.scheduler_before, before)
        seconds["unattributed"] += tree_total - sum(seconds[r] for r in SCHEDULER_TREE)
        return seconds

    def _role(self, pid: int, parents: Mapping[int, int], helpers: set[int], earlier: set[int]) -> str | None:
        """``pid``'s role below the scheduler, or None when it is not the scheduler's descendant.

        :param earlier: the processes that were running when the phase began
        """
        chain = [pid]
        while chain[-1] in parents and parents[chain[-1]] != self.scheduler:
            chain.append(parents[chain[-1]])
            if len(chain) > 64:  # a cycle through a reused pid
                return None
        if parents.get(chain[-1]) != self.scheduler:
            return None
        top = chain[-1]
        if top in helpers:
            return "fork_server"
        seen = self._seen.get(top)
        titled = seen is not None and seen.cmdline.startswith(WORKLOAD_TITLE)
        if not titled and top in earlier:
            # A child of the scheduler's own from before the phase that never took a workload's title:
            # Airflow's log server or health-check server.
            return "scheduler_other_children"
        return "workload" if len(chain) == 1 else "task_process"

    def per_task(self, tasks: int) -> dict[str, float | None]:
        """Each role's CPU seconds per task; None for every role when the account is unavailable."""
        if not self.seconds or not tasks:
            return unaccounted()
        return {**{metric(role): self.seconds[role] / tasks for role in ROLES}, EXITS: self.exits / tasks}


def unaccounted() -> dict[str, float | None]:
    """The figures of a run without an account: every role's None."""
    return {**{metric(role): None for role in ROLES}, EXITS: None}
