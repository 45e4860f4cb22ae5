"""Running task instances across a scheduler restart: what a stop records of each, and which ones a
successor holds until Airflow offers them for adoption.

Each task workload has one :class:`TaskRecord`, made at its launch and carried unchanged through every
stop, crash and adoption: what names its task instance, and the deadline of its run-time limit on the
boot clock. A stopping executor hands each running task workload over (``on_stop = handover``) with it;
the next executor of the same deployment and team holds every workload handed over that still runs
(``ops/recovery.py`` says which) from its start, and Airflow offers their task instances through
``try_adopt_task_instances``: after a stop at once, after a crash once the dead scheduler's job is older
than ``[scheduler] scheduler_health_check_threshold``, at the next orphan check.

Rule: a held workload is supervised (it holds a slot, its limit and stops apply) from the start, and
its end becomes Airflow's event only once its task instance was offered and claimed (:class:`Adoptions`,
which answers the same when asked twice): until then, an end is kept for that moment. A task instance
offered that no held workload runs is refused, and Airflow resets it as before.

:class:`Handovers` is one executor's side of it, from its start to its stop: what it holds, the
record each launch makes, the offers it answers, the holds it lets go, and what its stop journals. The
steps it takes live here too: whose workloads it holds (:func:`owner_key`), how long a hold waits for
Airflow's offer (:func:`hold_bound`), taking a held workload's process at once (:func:`taken_now`) and
reading its exit (:func:`read_exit_once`), stopping a duplicate it will not hold (:func:`kill_unheld`),
and a stop's wait for custody (:func:`into_custody`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter.submissions import Submission, Ticket, describe
from async_local_executor.core.cgroups.containment import recorded_cgroup
from async_local_executor.core.clock import Clock
from async_local_executor.core.custody import await_custody
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import LaunchRequest, Takeover
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.core.runtime import Runtime
from async_local_executor.core.supervisor import LetGo
from async_local_executor.ops import custody_dir, recovery
from async_local_executor.ops.journal import LaunchJournal

log = logging.getLogger(__name__)

RECORD_VERSION = 2  # what a record written by this version holds; another version's is refused cleanly


def boot_clock() -> float:
    """Seconds on ``CLOCK_BOOTTIME``: the clock every workload's deadline is on.

    It is the kernel's, the same in every process (a successor reads the deadline its predecessor
    recorded), and neither a step of the wall clock nor a suspend of the host stops or moves it.
    """
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class UnknownRecord(ValueError):
    """A task record this version cannot read (written by another version, or damaged)."""


@dataclass(frozen=True)
class TaskRecord:
    """What names a task workload's task instance and bounds its run, from its launch on.

    Made once, at the workload's launch, and carried unchanged through every handover, stop or crash:
    the launch journal holds it (a crash hands the workload over with it), a stop's handover line
    repeats it, and the executor that adopts the workload records the same one in its own journal. The
    one change: a stop that lets it go while its limit's stop is under way sets :attr:`kill_by`.
    """

    key: TaskInstanceKey
    ti_id: str | None
    launched: float
    """Wall clock of the launch, for what operators see; never for a limit."""
    deadline: float | None
    """When its run-time limit runs out, on :func:`boot_clock`; None for no limit."""
    kill_by: float | None = None
    """When its SIGKILL is due, on :func:`boot_clock`: set at a stop that let it go while it was being
    stopped for its limit (its SIGTERM sent, its grace period running), so that no later adopter grants
    it a whole grace period again. None: no stop of it had begun."""

    @classmethod
    def at_launch(
        cls, key: TaskInstanceKey, ti_id: str | None, timeout: float | None, *, wall: float, boot: float
    ) -> TaskRecord:
        return cls(key, ti_id, wall, boot + timeout if timeout is not None else None)

    def timeout_left(self, boot: float) -> float | None:
        """What is left of its limit at ``boot``; 0 or less once it ran out (``-5``: 5 seconds ago: its
        adopter's stop begins at once)."""
        return None if self.deadline is None else self.deadline - boot

    def kill_left(self, boot: float) -> float | None:
        """Seconds from ``boot`` until its SIGKILL is due (0 or less: due already); None: no stop of it
        had begun."""
        return None if self.kill_by is None else self.kill_by - boot

    def to_json(self) -> dict[str, object]:
        key = self.key
        return {
            "v": RECORD_VERSION,
            "dag_id": key.dag_id,
            "task_id": key.task_id,
            "run_id": key.run_id,
            "try_number": key.try_number,
            "map_index": key.map_index,
            "ti_id": self.ti_id,
            "launched": self.launched,
            "deadline": self.deadline,
            "kill_by": self.kill_by,
        }

    @classmethod
    def from_json(cls, info: Mapping[str, object]) -> TaskRecord:
        """The record ``info`` holds.

        :raises UnknownRecord: it holds none this version can read
        """
        if info.get("v") != RECORD_VERSION:
            raise UnknownRecord(f"record version {info.get('v')!r}, this version reads {RECORD_VERSION}")
        try:
            dag_id, task_id, run_id = (info[name] for name in ("dag_id", "task_id", "run_id"))
            try_number, map_index = info["try_number"], info["map_index"]
            ti_id, launched, deadline = info["ti_id"], info["launched"], info["deadline"]
        except KeyError as exc:
            raise UnknownRecord(f"no {exc.args[0]}") from None
        if not all(isinstance(part, str) for part in (dag_id, task_id, run_id)):
            raise UnknownRecord("dag_id, task_id and run_id must be strings")
        if type(try_number) is not int or type(map_index) is not int:
            raise UnknownRecord("try_number and map_index must be integers")
        if ti_id is not None and not isinstance(ti_id, str):
            raise UnknownRecord("ti_id must be a string or null")
        if not _seconds(launched) or (deadline is not None and not _seconds(deadline)):
            raise UnknownRecord("launched and deadline must be finite numbers of seconds")
        kill_by = info.get("kill_by")  # absent from a line this field is older than
        if kill_by is not None and not _seconds(kill_by):
            raise UnknownRecord("kill_by must be a finite number of seconds or null")
        key = TaskInstanceKey(str(dag_id), str(task_id), str(run_id), try_number, map_index)
        # _seconds() checked both are numbers.
        return cls(
            key,
            ti_id,
            float(launched),  # type: ignore[arg-type]
            None if deadline is None else float(deadline),  # type: ignore[arg-type]
            None if kill_by is None else float(kill_by),  # type: ignore[arg-type]
        )


def _seconds(value: object) -> bool:
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


@dataclass
class Adoption:
    """One handed-over workload this executor supervises, from its hold until its end is Airflow's."""

    key: TaskInstanceKey
    pid: int
    label: str
    held_at: float = 0.0  # monotonic: when it was held
    claimed: bool = False
    ended: Outcome | None = field(default=None, repr=False)  # its end, while unclaimed


class Adoptions:
    """The held workloads by task instance key. Scheduler thread only.

    A claim gives the same answer when asked twice: Airflow asks again with the same task instances
    when the database transaction around its first question failed (``run_with_db_retries``), and a
    task instance adopted once must not be refused then, nor its end given twice.
    """

    def __init__(self) -> None:
        self._held: dict[TaskInstanceKey, Adoption] = {}
        self._claimed: set[TaskInstanceKey] = set()  # every key claimed, also once its end was given
        self._claimed_pids: frozenset[int] = frozenset()  # replaced whole: the status writer reads it

    def hold(self, adoption: Adoption) -> None:
        self._held[adoption.key] = adoption

    def is_held(self, key: object) -> bool:
        """Whether ``key``'s end is not Airflow's yet: held, and its task instance not claimed."""
        held = self._held.get(key) if isinstance(key, TaskInstanceKey) else None
        return held is not None and not held.claimed

    def knows(self, key: object) -> bool:
        """Whether ``key`` is held here, or was claimed (and its end given)."""
        return key in self._held or key in self._claimed

    def holds_pid(self, key: object, pid: int) -> bool:
        """Whether ``key``'s held workload is process ``pid`` (until its end is given)."""
        held = self._held.get(key) if isinstance(key, TaskInstanceKey) else None
        return held is not None and held.pid == pid

    def was_claimed(self, key: object) -> bool:
        """Whether ``key`` was held here and its task instance offered and claimed."""
        return key in self._claimed

    def keep_end(self, key: TaskInstanceKey, outcome: Outcome) -> None:
        """An unclaimed workload ended: its end waits for its task instance to be offered."""
        self._held[key].ended = outcome

    def claim(self, key: TaskInstanceKey) -> bool:
        """Claim the held workload of an offered task instance: True when one runs it (or did, and was
        claimed before); False when none was handed over for it."""
        held = self._held.get(key)
        if held is None:
            return key in self._claimed
        held.claimed = True
        self._claimed.add(key)
        self._claimed_pids = self._claimed_pids | {held.pid}
        return True

    def unclaim(self, key: TaskInstanceKey) -> None:
        """Airflow handed ``key`` in again (a revoked try requeued under the same try number): the try it
        runs now was launched here, not handed over, and is reported as any other."""
        self._claimed.discard(key)

    def take_end(self, key: TaskInstanceKey) -> Outcome | None:
        """The end a claimed workload reached before its claim, once: None if it runs, or was taken."""
        held = self._held.get(key)
        if held is None or not held.claimed:
            return None
        ended, held.ended = held.ended, None
        return ended

    def forget(self, key: object) -> None:
        """Its end was given to Airflow."""
        if isinstance(key, TaskInstanceKey) and (gone := self._held.pop(key, None)) is not None:
            self._claimed_pids = self._claimed_pids - {gone.pid}

    def claimed_pid(self, pid: int) -> bool:
        """Whether the held workload ``pid`` was claimed: its task instance offered and adopted.

        Asked by the status writer from its own thread: it reads one immutable set.
        """
        return pid in self._claimed_pids

    def any_waiting(self) -> bool:
        """Whether a held workload waits for its claim (cheap: the scheduler asks every loop)."""
        return len(self._held) > len(self._claimed_pids)

    def unclaimed_since(self, before: float) -> list[Adoption]:
        """The ones not claimed yet that were held before ``before`` (monotonic)."""
        return [held for held in self._held.values() if not held.claimed and held.held_at < before]

    def waiting(self) -> list[Adoption]:
        """The ones not claimed yet."""
        return [held for held in self._held.values() if not held.claimed]


# What the executor does at either end of a handover: whose workloads it holds, how long Airflow may
# take to offer them, taking a held workload's process, and what a stop waits for.


def a_task(ticket: object) -> bool:
    """Only task workloads are handed over: Airflow adopts task instances, not callbacks or tests."""
    return isinstance(ticket, Ticket) and isinstance(ticket.key, TaskInstanceKey)


def read_exit_once(custody: Path, pid: int, start: int) -> int | None:
    """The exit code an adopted workload recorded, read at its exit; its custody files go then.

    Its outcome is ours from here on and nothing reads them again; left, they would pile up for as long
    as this scheduler runs (the next start removes only those no live executor answers for).
    """
    try:
        return custody_dir.read_exit(custody, pid, start)
    finally:
        with contextlib.suppress(OSError):
            custody_dir.remove(custody, pid, start)


def taken_now(take: Callable[[], AdoptedChild]) -> Callable[[], AdoptedChild]:
    """Take a held workload's process at once, for the supervisor to have it when the loop gets to it.

    Taken later (the loop gets to it after the start, and after a slot and the memory floor), a workload
    that ended meanwhile would be a failed launch ("no longer runs as the workload that was handed over")
    whatever exit code it recorded; taken now, its exit is read from that record as any adopted one's.
    """
    try:
        child = take()
    except LaunchError as exc:
        error = exc

        def failed() -> AdoptedChild:
            raise error

        return failed
    return lambda: child


def into_custody(let_go: Sequence[LetGo]) -> None:
    """A worker thread of the loop, before the loop thread exits: wait until each workload let go took
    custody of itself.

    One launched just before the stop may not have yet: a fork-server child then still has the helper's
    parent-death signal armed, which fires when the loop thread, its parent thread, exits. (The
    subprocess path's children have it too, until their custody clears it.) A crash meanwhile hands
    them over all the same: their launch lines already say so.
    """
    workloads = [(each.pid, start) for each in let_go if (start := start_ticks(each.pid)) is not None]
    late = await_custody(workloads, CUSTODY_WAIT)
    if late:
        log.warning(
            "%d handed-over workload(s) had not taken custody %.0fs after the stop (pid %s): they die "
            "with this scheduler, and their task instances are reset",
            len(late),
            CUSTODY_WAIT,
            ", ".join(map(str, late)),
        )


def kill_unheld(one: recovery.Held) -> None:
    """Kill a handed-over workload this executor will not supervise, and what it started: its process
    group (its custody's watchdog with it) and its cgroup's members, as for a workload this executor
    stops, and the descendants seen of it elsewhere; each only while it is still that process. The
    emptied cgroup is left for the next reclaim."""
    try:
        child = AdoptedChild.take(one.pid, one.start, lambda: None)
    except LaunchError:
        pass  # gone, or its pid is another process's now
    else:
        child.signal(signal.SIGKILL)
        if one.cgroup:
            with contextlib.suppress(OSError):
                cgroup = recorded_cgroup(Path(one.cgroup), one.pid)
                if cgroup is not None:
                    cgroup.signal(signal.SIGKILL)
        child.release()
    for pid, start in one.descendants:
        if runs_as(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# How long a stop waits for the workloads it handed over to take custody (a fork-server child within
# milliseconds of its launch, a fresh interpreter within its start): before, its exit may kill them.
CUSTODY_WAIT = 5.0


def owner_key(conf: Any, team: str | None) -> str:
    """Whose workloads an executor holds: its deployment (its metadata database) and its team.

    The database is named by what stays when credentials rotate or the driver changes: its backend,
    host, port and database, hashed (two deployments on one host may share a state directory, and one
    must not adopt what the other handed over). Neither the user, the password nor the query is in it.
    """
    from sqlalchemy.engine import make_url

    raw = conf.get("database", "sql_alchemy_conn", fallback="") or ""
    try:
        url = make_url(raw)
        backend = url.get_backend_name()
        port = url.port or _DEFAULT_PORTS.get(backend)
        named = f"{backend}://{(url.host or '').lower()}:{port or ''}/{url.database or ''}"
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse still names its deployment
        named = raw.rpartition("@")[2]
    deployment = hashlib.sha256(named.encode()).hexdigest()[:16]
    return f"{deployment}/{team or ''}"


_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
# Beyond Airflow's own bounds, for a scheduler whose loop runs late.
_HOLD_MARGIN = 120.0


def hold_bound(conf: Any) -> float:
    """How long Airflow may take to offer a dead scheduler's task instances: its orphan check's interval
    once the dead job's heartbeat counts as stale, and a margin."""
    interval = float(conf.getfloat("scheduler", "orphaned_tasks_check_interval", fallback=300.0))
    stale = float(conf.getfloat("scheduler", "scheduler_health_check_threshold", fallback=30.0))
    return interval + stale + _HOLD_MARGIN


class Handovers:
    """One executor's side of its task workloads' handovers, from its start to its stop.

    At its start it holds what its predecessor handed over (:meth:`hold`); at each launch it makes the
    workload's record (:meth:`launch_record`, the loop thread's only call here); when Airflow offers
    task instances it holds what a scheduler stopped since handed over (:meth:`reclaim_for`); at each
    sync it stops what was held too long unclaimed (:meth:`expire`); at its stop it journals what it
    hands over (:meth:`record`). Everything else is the scheduler's thread, but for
    ``holding.claimed_pid``, which the status writer's thread reads.

    :param submissions: the executor's, keyed by Airflow's key: a hold adds a held workload's, an
        expiry removes it; read for the label and ids of what is recorded
    :param ticket: a fresh ticket for a key (the executor's serials)
    """

    def __init__(
        self,
        clock: Clock,
        submissions: MutableMapping[Any, Submission],
        ticket: Callable[[TaskInstanceKey], Ticket],
    ) -> None:
        self.holding = Adoptions()
        self._clock = clock
        self._submissions = submissions
        self._ticket = ticket
        # Each task workload's record from its launch (or its hold) to its end: what a handover carries.
        # Written on the loop thread at a launch, read and dropped on the scheduler's thread.
        self._records: dict[TaskInstanceKey, TaskRecord] = {}
        # The custody countdown of each held workload whose launch set another than this executor's.
        self._custody_timeouts: dict[TaskInstanceKey, float] = {}
        self._place: _Place | None = None

    def open(
        self,
        *,
        state_dir: Path,
        journal: LaunchJournal,
        owner_key: str,
        hold_bound: float,
        handover_timeout: float,
    ) -> None:
        """Where this executor's handovers are kept, once its journal is open (before anything launches)."""
        self._place = _Place(
            state_dir, custody_dir.path(state_dir), journal, owner_key, hold_bound, handover_timeout
        )

    def close(self) -> None:
        """The executor stopped: its journal is closed or handed on, and nothing is held or recorded."""
        self._place = None

    # At a launch, and at an end.

    def launch_record(self, ticket: object) -> dict[str, object] | None:
        """What a launch records for a successor that adopts it after a crash; None: not a task.

        Its record is made here, at its launch (the loop thread's, as the supervisor arms its limit),
        once: a held workload's is the one its hold brought, and stays what its launch made it.
        """
        if not a_task(ticket):
            return None
        key = cast(TaskInstanceKey, cast(Ticket, ticket).key)
        submission = self._submissions.get(key)
        if submission is not None and submission.ticket != ticket:
            submission = None  # revoked while it launched: not the key's current submission's record
        record = self._records.get(key)
        if record is None or submission is None:
            record = TaskRecord.at_launch(
                key,
                submission.ti_id if submission else None,
                submission.timeout if submission else None,
                wall=self._clock.time(),
                boot=boot_clock(),
            )
            if submission is not None:
                self._records[key] = record
        return record.to_json()

    def submitted(self, key: object) -> None:
        """Airflow handed ``key`` in again: an earlier, revoked submission's record is not this one's, nor
        its claim."""
        if isinstance(key, TaskInstanceKey):
            self._records.pop(key, None)
            self.holding.unclaim(key)

    def ended(self, key: object) -> None:
        """``key``'s end was given to Airflow, or its submission revoked."""
        if isinstance(key, TaskInstanceKey):
            self.holding.forget(key)
            self._records.pop(key, None)
            self._custody_timeouts.pop(key, None)

    # Holding what was handed over, until Airflow offers it.

    def hold(self, handed: Sequence[recovery.Held], runtime: Runtime) -> None:
        """Supervise what a predecessor handed over, until Airflow offers its task instances.

        Each counts against parallelism from now on (the scheduler's count of running task instances
        already holds it), and its end waits for its task instance to be offered. Its limit is its
        record's deadline, set at its launch: what time passed since, with or without a scheduler,
        counted against it.
        """
        place = self._place
        assert place is not None
        held = []
        for one in handed:
            try:
                record = TaskRecord.from_json(one.info)
            except UnknownRecord as exc:
                log.warning(
                    "workload pid %d, handed over by %s, names no task instance this version reads (%s): "
                    "it is stopped, and the scheduler resets its task instance",
                    one.pid,
                    one.owner,
                    exc,
                )
                kill_unheld(one)
                continue
            key = record.key
            if self.holding.holds_pid(key, one.pid):
                continue  # this very workload, held already: a journal read again (its removal failed)
            if key in self._submissions:
                # Its custody names this process as its owner now, so its watchdog would never fire: a
                # second copy of the try, unsupervised, until it ended on its own.
                log.warning(
                    "workload pid %d (%s), handed over by %s, is a try this executor already runs: it is "
                    "stopped, and the try runs on in this executor's own workload",
                    one.pid,
                    describe(key),
                    one.owner,
                )
                kill_unheld(one)
                continue
            label = describe(key)
            ticket = self._ticket(key)
            self._submissions[key] = Submission(
                ticket,
                None,
                TaskInstanceState.SUCCESS,
                TaskInstanceState.FAILED,
                label,
                accepted=self._clock.time(),
                ti_id=record.ti_id,
            )
            self._records[key] = record
            if one.timeout != place.handover_timeout:
                self._custody_timeouts[key] = one.timeout
            self.holding.hold(Adoption(key, one.pid, label, held_at=self._clock.monotonic()))
            read = functools.partial(read_exit_once, place.custody, one.pid, one.start)
            take = taken_now(functools.partial(AdoptedChild.take, one.pid, one.start, read))
            boot = boot_clock()
            runtime.adopt(
                LaunchRequest(
                    key=ticket,
                    argv=("adopted",),
                    label=label,
                    timeout=record.timeout_left(boot),
                    takeover=Takeover(take, record.launched, one.cgroup, record.kill_left(boot)),
                )
            )
            held.append(one)
        crashed = sum(one.crashed for one in held)
        if held:
            log.info(
                "holding %d running workload(s) for adoption when the scheduler offers their task instances: "
                "%d handed over by a stopped scheduler, %d left running by a crashed one (%s)",
                len(held),
                len(held) - crashed,
                crashed,
                ", ".join(f"pid {one.pid}" for one in held[:10]) + (" ..." if len(held) > 10 else ""),
            )

    def reclaim_for(self, offered: set[TaskInstanceKey], runtime: Runtime) -> None:
        """Hold what an executor of this deployment and team that stopped since this one started handed
        over, from the journals that name a task instance of ``offered``.

        Only now, and only those journals: Airflow offered these task instances to this scheduler, so
        they are its to take; a journal taken otherwise may hold what Airflow offers another scheduler.
        """
        place = self._place
        if place is None:
            return

        def wanted(info: Mapping[str, object]) -> bool:
            try:
                return TaskRecord.from_json(info).key in offered
            except UnknownRecord:
                return False

        self.hold(
            recovery.reclaim_since(place.state_dir, place.journal, owner_key=place.owner_key, wanted=wanted),
            runtime,
        )

    def expire(self, runtime: Runtime | None) -> None:
        """Stop and forget the held workloads whose task instances Airflow never offered.

        It offers a dead scheduler's task instances within ``[scheduler] orphaned_tasks_check_interval``
        once the dead job's heartbeat is ``scheduler_health_check_threshold`` old; one not offered by
        then went to another scheduler, which reset it (or it ended). Held on, its process would run
        beside its task instance's next try until its heartbeat is refused.
        """
        place = self._place
        if place is None or not self.holding.any_waiting():
            return
        for held in self.holding.unclaimed_since(self._clock.monotonic() - place.hold_bound):
            self.ended(held.key)
            submission = self._submissions.pop(held.key, None)
            if held.ended is not None or submission is None or runtime is None:
                continue
            log.warning(
                "workload pid %d (%s) was held %.0fs for adoption and the scheduler never offered its task "
                "instance (another scheduler took it, or reset it): it is stopped",
                held.pid,
                held.label,
                place.hold_bound,
            )
            runtime.stop(submission.ticket, "never offered for adoption")

    # At the stop.

    def record(self, handovers: Sequence[LetGo]) -> int:
        """Journal each handed-over workload and mark it handed over in its custody file; how many."""
        place = self._place
        if place is None:
            return 0
        me, my_start = os.getpid(), start_ticks(os.getpid()) or 0
        recorded = 0
        for released in handovers:
            key = cast(Ticket, released.key).key
            submission = self._submissions.get(key)
            start = start_ticks(released.pid)
            if not isinstance(key, TaskInstanceKey) or submission is None or start is None:
                continue  # ended meanwhile: its task reported its own end, or the next scheduler resets it
            record = self._records.get(key)
            if record is None:  # every task launch makes one: a bug, and its limit is lost with it
                log.warning(
                    "workload %s has no launch record: handed over without its limit", submission.label
                )
                record = TaskRecord(key, submission.ti_id, released.launched, None)
            if released.kill_in is not None:  # being stopped for its limit: when its SIGKILL is due
                record = dataclasses.replace(record, kill_by=boot_clock() + released.kill_in)
            # The workload's own countdown, which its launch set: what its custody holds it to.
            timeout = self._custody_timeouts.get(key, place.handover_timeout)
            place.journal.handed_over(released.pid, record.to_json(), released.cgroup, timeout)
            custody_dir.name_owner(place.custody, released.pid, start, me, my_start)
            recorded += 1
        return recorded


@dataclass(frozen=True)
class _Place:
    """Where an open executor's handovers are kept, and its settings for them."""

    state_dir: Path
    custody: Path
    journal: LaunchJournal
    owner_key: str
    hold_bound: float
    handover_timeout: float
