"""The event-loop thread, and the two hand-offs between it and the scheduler's thread.

Inbound, the scheduler thread appends an operation to a deque and wakes the loop with
``loop.call_soon_threadsafe``, which writes one byte to the loop's self-pipe in non-blocking mode (the
byte is dropped when that pipe is full, since the loop is then already awake), so it can never block. Outbound, the
loop appends to a :class:`collections.deque` that the scheduler thread pops in ``sync()``; both ends of a
deque are atomic and never wait.

A process that forks while the loop thread runs (Airflow 2's scheduler forks its DAG file processor
manager after the executor has started, and again whenever that manager dies) would hand its child
whatever lock the loop thread held at that instant, held for ever. So the loop parks itself at a point
where it holds none, in a callback between two steps of the loop, for as long as each fork takes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping

import anyio
import anyio.abc
import anyio.to_thread

from async_local_executor.core.errors import RuntimeNotRunning
from async_local_executor.core.health import Probe, Report
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.lifeline import prctl
from async_local_executor.core.supervisor import LetGo, Supervisor, every

log = logging.getLogger(__name__)

_Op = Callable[[Supervisor, anyio.abc.TaskGroup], object]

# start() waits this long for the loop thread to come up; it only guards against a hang.
START_TIMEOUT = 60.0
# The loop thread's name in the kernel (15 characters at most): `top -H`, `ps -L` and
# /proc/<pid>/task/*/comm show its CPU apart from the scheduler's own thread.
THREAD_NAME = "ale-loop"
_PR_SET_NAME = 15
# A fork waits this long at most for the loop to park; the loop waits this long at most to be resumed.
FORK_PARK_TIMEOUT = 5.0
FORK_RESUME_TIMEOUT = 60.0

# The runtimes whose loop threads run in this process, for the at-fork hooks below.
_RUNNING: weakref.WeakSet[Runtime] = weakref.WeakSet()


def _park_all() -> None:
    for runtime in list(_RUNNING):
        runtime.park_for_fork()


def _resume_all() -> None:
    for runtime in list(_RUNNING):
        runtime.resume_after_fork()


def _forget_all() -> None:
    _RUNNING.clear()  # the child has none of these threads


os.register_at_fork(before=_park_all, after_in_parent=_resume_all, after_in_child=_forget_all)


def name_this_thread(name: str) -> None:
    """Name the calling thread in the kernel."""
    prctl(_PR_SET_NAME, name.encode()[:15])


async def _contained(fn: Callable[[], object]) -> None:
    try:
        await anyio.to_thread.run_sync(fn)
    except anyio.get_cancelled_exc_class():
        raise
    except BaseException:
        log.exception("a blocking call run for the executor (%r) failed; the event loop carries on", fn)


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


class Runtime:
    """Runs a :class:`Supervisor` on an event loop in a dedicated daemon thread.

    :param make_supervisor: builds the supervisor on the loop thread (anyio objects bind to the loop
        that creates them)
    :param use_uvloop: run the loop on uvloop
    :param make_probe: builds the health probe, run on the loop beside the supervisor
    """

    def __init__(
        self,
        make_supervisor: Callable[[], Supervisor],
        *,
        use_uvloop: bool,
        make_probe: Callable[[Supervisor], Probe] | None = None,
    ) -> None:
        self._make_supervisor = make_supervisor
        self._make_probe = make_probe
        self._probe: Probe | None = None
        self._use_uvloop = use_uvloop
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._wake: asyncio.Event | None = None
        self._inbox: deque[_Op] = deque()
        self._resume: threading.Event | None = None

    @property
    def failure(self) -> BaseException | None:
        """What ended the loop thread, if it died."""
        return self._failure

    @property
    def report(self) -> Report | None:
        """The health probe's latest report; a plain attribute read, safe from any thread."""
        probe = self._probe
        return probe.report if probe is not None else None

    @property
    def thread(self) -> threading.Thread | None:
        """The loop thread, once started; its ``native_id`` is its entry in ``/proc/<pid>/task``."""
        return self._thread

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._loop is not None

    def start(self) -> None:
        """Start the loop thread and wait until it accepts work."""
        if self._thread is not None:
            raise RuntimeError("runtime already started")
        self._thread = threading.Thread(target=self._main, name="async-local-executor-loop", daemon=True)
        self._thread.start()
        _RUNNING.add(self)
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeNotRunning(f"event loop thread did not start within {START_TIMEOUT}s")
        if self._failure is not None:
            raise RuntimeNotRunning(
                f"event loop thread failed to start: {self._failure!r}"
            ) from self._failure

    def submit(self, requests: Iterable[LaunchRequest]) -> None:
        """Hand requests to the loop; returns at once."""
        batch = list(requests)
        if not batch:
            return

        def submit_all(supervisor: Supervisor, _: anyio.abc.TaskGroup) -> None:
            for request in batch:
                supervisor.submit(request)

        self._post(submit_all)

    def adopt(self, request: LaunchRequest) -> None:
        """Hand the loop a running process to supervise (see :meth:`Supervisor.adopt`); returns at once."""
        self._post(lambda supervisor, _: supervisor.adopt(request))

    def control(self, *, paused: bool, limit: int | None, group_limits: Mapping[str, int]) -> None:
        """Hold pausable launches back or let them go, and set the limits in force; returns at once.

        :raises ValueError: a limit below 1 (checked here, before anything changes)
        """
        for value in (1 if limit is None else limit, *group_limits.values()):
            if value < 1:
                raise ValueError(f"a limit must be >= 1, got {value}")
        limits = dict(group_limits)

        def apply(supervisor: Supervisor, _: anyio.abc.TaskGroup) -> None:
            supervisor.resize(limit, limits)
            supervisor.hold_starts(paused)

        self._post(apply)

    def stop(self, key: Hashable, reason: str) -> None:
        """Ask the loop to stop the workload(s) with ``key``; returns at once."""
        self._post(lambda supervisor, _: supervisor.stop(key, reason))

    def run_blocking(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in a worker thread of the loop; returns at once. For blocking I/O that neither the
        scheduler's thread nor the loop's may wait on.

        Whatever ``fn`` raises is logged here, once: the caller has returned by then, and an exception
        let into the loop's task group would end the loop thread, and every workload's supervision
        with it.
        """
        self._post(lambda _, tg: tg.start_soon(_contained, fn))

    def shutdown(self, wait: float, timeout: float) -> None:
        """Give workloads ``wait`` seconds, stop the rest, and join the loop thread.

        Blocks the calling thread: for ``end()`` and ``terminate()`` only.

        :param timeout: give up joining after this long (the thread is a daemon, so it cannot keep the
            process alive)
        """
        thread = self._thread
        if thread is None or not self.alive:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        async def shut(supervisor: Supervisor) -> None:
            await supervisor.shutdown(wait)
            done.set_result(None)

        # One bound for both waits: a loop stuck in the first must not be given the whole bound again.
        # The real clock, not an injected one: it bounds real waits on a real thread, which a fake clock
        # could neither shorten nor lengthen.
        deadline = time.monotonic() + timeout
        self._post(lambda supervisor, tg: tg.start_soon(shut, supervisor))
        try:
            done.result(timeout)
        except concurrent.futures.TimeoutError:
            log.error("event loop did not finish shutting down within %.1fs", timeout)
        thread.join(max(0.0, deadline - time.monotonic()))

    def release(
        self,
        grace: float,
        timeout: float,
        which: Callable[[Hashable], bool] = every,
        settle: Callable[[list[LetGo]], object] | None = None,
    ) -> list[LetGo]:
        """Let every running workload go alive (see :meth:`Supervisor.release`) and join the loop thread.

        Blocks the calling thread: for ``end()`` only.

        :param grace: how long workloads that cannot be let go (being stopped, or launched where a
            process cannot be let go) get to end before they are stopped
        :param timeout: give up after this long; what was let go by then is returned
        :param which: the keys of the workloads that may be let go; the others are stopped
        :param settle: called in a worker thread with what was let go, before the loop thread exits:
            a child forked for the loop thread dies with it while its parent-death signal is armed, so
            whatever it must do first (take custody of itself) is waited for here
        """
        thread = self._thread
        if thread is None or not self.alive:
            return []
        done: concurrent.futures.Future[list[LetGo]] = concurrent.futures.Future()

        async def release(supervisor: Supervisor) -> None:
            let_go = await supervisor.release(grace, which=which)
            if settle is not None:
                try:
                    await anyio.to_thread.run_sync(settle, let_go)
                except Exception:
                    log.exception("settling the workloads handed over failed")
            done.set_result(let_go)

        deadline = time.monotonic() + timeout
        self._post(lambda supervisor, tg: tg.start_soon(release, supervisor))
        try:
            handovers = done.result(timeout)
        except concurrent.futures.TimeoutError:
            log.error("event loop did not finish handing workloads over within %.1fs", timeout)
            handovers = []
        thread.join(max(0.0, deadline - time.monotonic()))
        return handovers

    def park_for_fork(self) -> None:
        """Before a fork by another thread: wait until the loop thread is parked holding no lock."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or thread is threading.current_thread() or not self.alive:
            return
        parked, resume = threading.Event(), threading.Event()

        def park() -> None:
            parked.set()
            # Bounded: a fork whose after-hook never ran must not stop the executor for good.
            if not resume.wait(FORK_RESUME_TIMEOUT):
                log.warning(
                    "a fork did not resume the event loop within %.0fs; it goes on", FORK_RESUME_TIMEOUT
                )

        try:
            loop.call_soon_threadsafe(park)
        except RuntimeError:  # the loop closed meanwhile
            return
        self._resume = resume
        if not parked.wait(FORK_PARK_TIMEOUT):
            log.warning(
                "the event loop did not pause within %.0fs for a fork; forking anyway", FORK_PARK_TIMEOUT
            )

    def resume_after_fork(self) -> None:
        """After the fork, in the parent: let the loop thread go on."""
        resume, self._resume = self._resume, None
        if resume is not None:
            resume.set()

    def _post(self, op: _Op) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or not self.alive:
            raise RuntimeNotRunning("the executor's event loop thread is not running") from self._failure
        self._inbox.append(op)
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError as exc:  # the loop closed between our check and the call
            raise RuntimeNotRunning("the executor's event loop thread is not running") from exc

    def _main(self) -> None:
        name_this_thread(THREAD_NAME)
        try:
            anyio.run(self._serve, backend="asyncio", backend_options={"use_uvloop": self._use_uvloop})
        except BaseException as exc:
            self._failure = exc
            log.critical("the executor's event loop thread died; no workload can run", exc_info=exc)
        finally:
            self._loop = None
            self._ready.set()

    async def _serve(self) -> None:
        supervisor = self._make_supervisor()
        self._wake = asyncio.Event()
        async with anyio.create_task_group() as tg:

            async def serve_then_stop(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                await supervisor.serve(task_status=task_status)
                tg.cancel_scope.cancel()  # shutdown finished: stop the pump too

            await tg.start(serve_then_stop)
            tg.start_soon(self._pump, supervisor, tg)
            if self._make_probe is not None:
                self._probe = self._make_probe(supervisor)
                tg.start_soon(self._probe.run)
            self._loop = asyncio.get_running_loop()
            self._ready.set()

    async def _pump(self, supervisor: Supervisor, tg: anyio.abc.TaskGroup) -> None:
        # Operations run here, inside a task, because anyio objects need a task context; a bare
        # call_soon_threadsafe callback has none.
        wake = self._wake
        assert wake is not None
        while True:
            await wake.wait()
            wake.clear()
            while self._inbox:
                self._inbox.popleft()(supervisor, tg)
