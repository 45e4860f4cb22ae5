"""The skeleton both workload entry points share (:mod:`~.airflow3` and :mod:`~.airflow2`).

Each entry point supplies only how its payload is read and how it runs; the rest (the argv flags, the
tie to the executor, the CPU priority, the exit codes) is the same for both and is written here once.
Only what is no secret travels on argv (``/proc/<pid>/cmdline`` is world-readable): the workload itself
comes on stdin or, from the fork server, in memory.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NoReturn, TypeVar

from async_local_executor.adapter import tasklog
from async_local_executor.adapter.tasklog import TaskLogFile
from async_local_executor.core import cpu_priority, custody, lifeline
from async_local_executor.core.launchers.forkserver.learning import observe

EXIT_OK = 0  # the workload ran to its end (whatever the task's own outcome, which it reports itself)
EXIT_CRASHED = 1  # running the workload raised
EXIT_BAD_INPUT = 2  # the payload on stdin could not be read as a workload
EXIT_ORPHANED = lifeline.EXIT_ORPHANED  # the executor was gone before we started (and no handover)
# The api-server no longer knows the task instance this workload was for (Airflow 3: it was cleared, so it
# has a new id, while the workload started or ran): nothing of it can run or be reported any more.
EXIT_TI_GONE = 4

P = TypeVar("P")


@dataclass(frozen=True)
class EntryArgs:
    parent_pid: int  # 0: not checked
    cpu_priority: str
    learn_imports: str = ""  # where to record the modules the workload loads; empty: not recorded
    path0: str | None = None  # the scheduler's sys.path[0], for ours (None: left as the interpreter set it)
    # How long the workload outlives its executor waiting to be adopted, in seconds (0: it dies with it).
    handover_timeout: float = 0.0
    custody_dir: str = ""  # where its custody files are (empty: no handover)

    @property
    def hands_over(self) -> bool:
        """Whether this workload is handed over when its executor goes, rather than dying with it."""
        return self.handover_timeout > 0 and bool(self.custody_dir) and self.parent_pid > 0


# The flags, written by argv_flags() and read by parse(), each with its value in the next word.
PARENT_PID = "--parent-pid"
CPU_PRIORITY = "--cpu-priority"
LEARN_IMPORTS = "--learn-imports"
PATH0 = "--path0"
HANDOVER_TIMEOUT = "--handover-timeout"
CUSTODY_DIR = "--custody-dir"
_FLAGS = (PARENT_PID, CPU_PRIORITY, LEARN_IMPORTS, PATH0, HANDOVER_TIMEOUT, CUSTODY_DIR)
N = TypeVar("N", int, float)


def parse(argv: Sequence[str] | None) -> EntryArgs:
    """The entry flags; anything else on the command line (the interpreter, ``-m module``) is ignored.

    Read by hand, not with :mod:`argparse`: building a parser in a forked workload cost 1.8 ms of CPU
    and 320 page faults per task (its messages go through :mod:`gettext`, which looks for translation
    files), more than the rest of this module's work before the supervisor starts
    (``python -m benchmarks.entry_cost``; docs/benchmarks.md, "Where each task's CPU goes, by role").
    A value is the next word whatever it starts with (the executor writes each one), and ``--`` ends
    nothing: the flags sit after the module the interpreter runs.

    :raises SystemExit: ``EXIT_BAD_INPUT``, said on stderr, for a flag without a value or a number
        that is not one (the executor writes these flags: only a hand-written command line has either)
    """
    words = list(sys.argv[1:] if argv is None else argv)
    found: dict[str, str] = {}
    index = 0
    while index < len(words):
        flag, equals, value = words[index].partition("=")
        index += 1
        if flag not in _FLAGS:
            continue
        if not equals:
            if index >= len(words):
                _refuse(f"{flag} needs a value")
            value = words[index]
            index += 1
        found[flag] = value
    return EntryArgs(
        _number(found, PARENT_PID, int),
        found.get(CPU_PRIORITY, cpu_priority.NORMAL),
        found.get(LEARN_IMPORTS, ""),
        found.get(PATH0),
        _number(found, HANDOVER_TIMEOUT, float),
        found.get(CUSTODY_DIR, ""),
    )


def _number(found: dict[str, str], flag: str, kind: type[N]) -> N:
    try:
        return kind(found.get(flag, "0"))
    except ValueError:
        _refuse(f"{flag} must be a number, got {found[flag]!r}")


def _refuse(why: str) -> NoReturn:
    print(f"async_local_executor: invalid workload command line: {why}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def argv_flags(
    parent_pid: int,
    priority: str,
    learn_imports: str = "",
    path0: str | None = None,
    *,
    handover_timeout: float = 0.0,
    custody_dir: str = "",
) -> tuple[str, ...]:
    """The flags the executor puts on a workload's command line (no secret: argv is world-readable).

    :param path0: the scheduler's ``sys.path[0]``, which the workload takes for its own
    :param handover_timeout: how long the workload waits to be adopted once its executor is gone, in
        seconds; 0 (and no ``custody_dir``) keeps it tied to the executor's life
    :param custody_dir: the directory of the custody files (``<state_dir>/custody``)
    """
    learn = (LEARN_IMPORTS, learn_imports) if learn_imports else ()
    first = (PATH0, path0) if path0 is not None else ()
    handover = (HANDOVER_TIMEOUT, repr(float(handover_timeout))) if handover_timeout > 0 else ()
    where = (CUSTODY_DIR, custody_dir) if custody_dir else ()
    return (PARENT_PID, str(parent_pid), CPU_PRIORITY, priority, *learn, *first, *handover, *where)


def tie_to_executor(args: EntryArgs, *, tied: bool) -> tuple[bool, custody.Custody | None]:
    """Tie this process to its executor: custody when it is handed over, else death with the executor.

    :param tied: whether the process dies with the executor already (a fork-server child: the helper
        armed its parent-death signal)
    :returns: whether the workload may run (an executor gone before the process took custody handed
        it over all the same: a successor adopts it), and the custody when the process is in one
    """
    if args.hands_over and custody.supported():
        try:
            held = custody.Custody.start(args.parent_pid, args.handover_timeout, args.custody_dir)
        except (OSError, RuntimeError) as exc:  # no fd or thread left: it runs, tied as without a handover
            say = "async_local_executor: this workload cannot be handed over, it dies with the executor"
            print(f"{say}: {exc}", file=sys.stderr, flush=True)
            tied = False  # custody cleared the parent-death signal before it failed
        else:
            return held is not None, held
    if tied:
        return True, None
    # SIGKILL, as a fork-server child gets: Airflow 3's task supervisor answers SIGTERM by passing it on
    # to the task and waiting, so a task that ignores it would outlive the executor. Killed outright, this
    # process takes its task process with it (tie_direct_children in run_payload).
    return lifeline.die_with_parent(args.parent_pid, signal.SIGKILL), None


def prepare(args: EntryArgs) -> None:
    """Before the workload runs: its CPU priority, and the record of what it imports if asked for."""
    if args.path0 is not None and sys.path:
        # `python -m` put the working directory ($AIRFLOW_HOME, often) first on the path, where a stray
        # file there would shadow a library; a task of the stock executor, forked from the scheduler,
        # has the scheduler's first entry (the `airflow` script's folder).
        sys.path[0] = args.path0
    lower_priority(args)
    freeze_before_first_fork()
    if args.learn_imports:
        # The task's own process is forked from this one and inherits the hook (Airflow 3's task SDK
        # and Airflow 2's `tasks run --local` both fork it): what it imports is what is learned.
        observe.install(args.learn_imports)


def freeze_before_first_fork() -> None:
    """Freeze the objects this process holds when it forks the task's own process, once.

    That fork (the task SDK's, or ``tasks run --local``'s) shares this process's pages with the task;
    a page either process writes afterwards is copied, and each one's garbage collector would write to
    every object it tracks. Frozen, those objects are never traversed again (docs/design.md, "What a
    task touches is what it costs"). Only the first fork, and only in this process: a
    task that forks again must not have its garbage frozen for good each time.
    """
    owner = os.getpid()
    frozen = False

    def before_fork() -> None:
        nonlocal frozen
        if not frozen and os.getpid() == owner:
            frozen = True
            gc.freeze()

    os.register_at_fork(before=before_fork)


def lower_priority(args: EntryArgs) -> None:
    """Apply the CPU priority; a failure is said on stderr (the scheduler log) and the workload runs."""
    problem = cpu_priority.apply(args.cpu_priority)
    if problem:
        print(f"async_local_executor: {problem}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Entry(Generic[P]):
    """One workload entry point: what differs between them is how a payload is read and run.

    :param name: the entry point's module, naming it in what it says on stderr
    :param what: what its payload is called there ("workload", "command")
    :param read: the payload from the raw bytes; raises on anything it cannot run (bad input)
    :param run: run it in this process and return the exit code; raising counts as a crash
    :param task_log: the payload's task log file, asked for when a workload in custody fails or kills
        itself after its executor's exit (None: not known, or not yet); what it said since goes there
    """

    name: str
    what: str
    read: Callable[[bytes], P]
    run: Callable[[P], int]
    task_log: Callable[[P], TaskLogFile | None] | None = None

    def main(self, argv: list[str] | None = None) -> int:
        """Entry point of a fresh interpreter: the payload is on stdin."""
        args = parse(argv)
        there, held = tie_to_executor(args, tied=False)
        if not there:
            return EXIT_ORPHANED
        prepare(args)
        return self.run_recorded(held, sys.stdin.buffer.read())

    def forked_main(self, argv: list[str], stdin: bytes) -> int:
        """Entry point inside a fork-server child: the payload is handed over in memory.

        The fork server forked this process as the scheduler's own child and tied its life to the
        scheduler's (``PR_SET_PDEATHSIG``): without a handover, it dies with the scheduler, not with the
        helper. With one, custody clears that tie and answers for the process instead.
        """
        args = parse(argv)
        there, held = tie_to_executor(args, tied=True)
        if not there:
            return EXIT_ORPHANED
        prepare(args)
        return self.run_recorded(held, stdin)

    def run_recorded(self, held: custody.Custody | None, raw: bytes) -> int:
        """Run one payload; in custody, its exit code is recorded for an adopter before it is returned.

        What it writes once its executor is gone reaches no scheduler's log: when it fails (or kills
        itself), the last of it goes to its task's log instead.
        """
        if held is None:
            return self.run_payload(raw)
        code = EXIT_CRASHED
        try:
            code = self.run_payload(raw, functools.partial(self._tell_task_log, held))
        except SystemExit as exc:  # a run that exits instead of returning: the same code, still recorded
            code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_CRASHED)
            raise
        finally:
            held.record_exit(code)
        return code

    def run_payload(self, raw: bytes, read: Callable[[P], None] | None = None) -> int:
        """Run one payload; return the process exit code.

        :param read: given the payload once it is read, before it runs
        """
        try:
            payload = self.read(raw)
        except Exception as exc:  # noqa: BLE001 - any unreadable payload is the same failure: bad input
            print(f"{self.name}: invalid {self.what} on stdin: {exc}", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        if read is not None:
            read(payload)
        # The task's own process is forked into a process group of its own (by the task SDK, or by
        # `tasks run --local`); tie it to this process so that it cannot outlive us when we are
        # killed outright (or die with the executor).
        lifeline.tie_direct_children()
        try:
            return self.run(payload)
        except Exception:  # noqa: BLE001 - the exit code carries it; the traceback goes to our log
            traceback.print_exc()
            sys.stdout.flush()
            return EXIT_CRASHED

    def _tell_task_log(self, held: custody.Custody, payload: P) -> None:
        task_log = self.task_log
        if task_log is None:
            return

        def tell(lines: list[str]) -> None:
            # Asked for then, not now: Airflow 2's is known only once `tasks run` has set its logging up.
            where = task_log(payload)
            if where is not None:
                tasklog.append_lines(where, lines)

        held.tell = tell
