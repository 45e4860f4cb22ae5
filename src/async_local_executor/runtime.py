"""The event-loop thread, and the two hand-offs between it and the scheduler's thread.

Inbound, the scheduler thread schedules a callback with ``loop.call_soon_threadsafe``: it appends to the
loop's ready queue and writes one byte to the loop's self-pipe in non-blocking mode (asyncio drops the
byte when that pipe is full, since the loop is then already awake), so it can never block. Outbound, the
loop appends to a :class:`collections.deque` that the scheduler thread pops in ``sync()``; both ends of a
deque are atomic and never wait.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Hashable, Iterable

import anyio

from async_local_executor.errors import RuntimeNotRunning
from async_local_executor.launchers.base import LaunchRequest
from async_local_executor.supervisor import Supervisor

log = logging.getLogger(__name__)

# start() waits this long for the loop thread to come up; it only guards against a hang.
START_TIMEOUT = 60.0


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
    """

    def __init__(self, make_supervisor: Callable[[], Supervisor], *, use_uvloop: bool) -> None:
        self._make_supervisor = make_supervisor
        self._use_uvloop = use_uvloop
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: Supervisor | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._loop is not None

    def start(self) -> None:
        """Start the loop thread and wait until it accepts work."""
        if self._thread is not None:
            raise RuntimeError("runtime already started")
        self._thread = threading.Thread(target=self._main, name="async-local-executor-loop", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeNotRunning(f"event loop thread did not start within {START_TIMEOUT}s")
        if self._failure is not None:
            raise RuntimeNotRunning(f"event loop thread failed to start: {self._failure!r}") from self._failure

    def submit(self, requests: Iterable[LaunchRequest]) -> None:
        """Hand requests to the loop; returns at once."""
        batch = list(requests)
        if batch:
            self._call_soon(self._submit_all, batch)

    def stop(self, key: Hashable, reason: str) -> None:
        """Ask the loop to stop the workload(s) with ``key``; returns at once."""
        self._call_soon(self._stop, key, reason)

    def shutdown(self, wait: float, timeout: float) -> None:
        """Give workloads ``wait`` seconds, stop the rest, and join the loop thread.

        Blocks the calling thread: for ``end()`` and ``terminate()`` only.

        :param timeout: give up joining after this long (the thread is a daemon, so it cannot keep the
            process alive)
        """
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        supervisor = self._supervisor
        assert supervisor is not None
        future = asyncio.run_coroutine_threadsafe(supervisor.shutdown(wait), self._loop)
        try:
            future.result(timeout)
        except TimeoutError:
            log.error("event loop did not finish shutting down within %.1fs", timeout)
        self._thread.join(timeout)

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        loop = self._loop
        if loop is None or not self.alive:
            raise RuntimeNotRunning("the executor's event loop thread is not running") from self._failure
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError as exc:  # the loop closed between our check and the call
            raise RuntimeNotRunning("the executor's event loop thread is not running") from exc

    def _submit_all(self, batch: list[LaunchRequest]) -> None:
        assert self._supervisor is not None
        for request in batch:
            self._supervisor.submit(request)

    def _stop(self, key: Hashable, reason: str) -> None:
        assert self._supervisor is not None
        self._supervisor.stop(key, reason)

    def _main(self) -> None:
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
        async with anyio.create_task_group() as tg:
            await tg.start(supervisor.serve)
            self._supervisor = supervisor
            self._loop = asyncio.get_running_loop()
            self._ready.set()
