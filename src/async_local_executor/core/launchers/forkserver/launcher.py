"""The fork server's policy: when a helper starts, is replaced or stops, and when a launch falls back.

A fork of a process that already imported the task SDK costs milliseconds; a fresh interpreter costs
about two seconds of CPU. The scheduler itself cannot fork (its event-loop thread makes it
multi-threaded), so the forking happens in a helper started with ``exec``
(:mod:`~async_local_executor.core.launchers.forkserver.helper`; the messages between the two are
:mod:`~async_local_executor.core.launchers.forkserver.protocol`).

This module is the policy: when a helper starts, is replaced (when it dies, hangs, or what workloads
import has grown: :mod:`~async_local_executor.core.launchers.forkserver.learning`) or stops while
idle, and when a launch goes to the fallback launcher. A replaced helper costs no running workload; requests it had not started go to a fresh one.
A helper that cannot start, for any reason (out of descriptors, a start timeout on an overloaded host,
a host where it cannot fork), costs at most the launches made while it is down: they go to the
fallback, and a new helper is tried again after a backoff. One that must not fork (a preload started
threads) sends every launch to the fallback from then on, with one warning; a request too large for
the channel goes there alone.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType

import anyio
import anyio.abc
from typing_extensions import Self

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.base import (
    Child,
    Launcher,
    LauncherReport,
    LaunchRequest,
    OutputSink,
    PreloadSummary,
    refuse_takeover,
)
from async_local_executor.core.launchers.forkserver import LOGGER
from async_local_executor.core.launchers.forkserver.channel import MessageTooLarge
from async_local_executor.core.launchers.forkserver.learning.loop import Learning, describe
from async_local_executor.core.launchers.forkserver.process import (
    HelperDied,
    HelperProcess,
    HelperSpec,
    HelperUnfit,
    LearnedModuleFailed,
    start_helper,
)
from async_local_executor.core.launchers.forkserver.protocol import BUFFER, Checked, PreloadReport
from async_local_executor.core.launchers.output import discard

__all__ = ["RESTART_DELAY_MAX", "ForkServerLauncher"]

log = logging.getLogger(LOGGER)

# Longest wait before a dead helper is replaced (kept warm); one that lived longer waits restart_delay.
RESTART_DELAY_MAX = 60.0
# Longest wait before a helper that could not start is tried again (each failure doubles the wait).
START_RETRY_MAX = 600.0
# How long a closed helper is awaited (at shutdown, or stopped while idle) before it is left to exit.
CLOSE_WAIT = 10.0


class ForkServerLauncher:
    """Launches workloads through a fork-server helper, replacing it when it dies or stops progressing.

    :param target: ``module:function`` run in each child with ``(argv, stdin_bytes)``; its module may
        define ``preload()``, called once in the helper before the first fork
    :param preload: more modules the helper imports before forking (heavy libraries DAGs use)
    :param output: receives each line a child writes
    :param fallback: used for every launch once a helper cannot start, and for requests too large for
        the channel
    :param env: the helper's environment, which every child inherits; ``None`` to inherit ours
    :param ping_interval: seconds between liveness checks of the helper
    :param ping_timeout: a helper that shows no progress for this long (counted in ticks of
        ``ping_interval``, however late each one wakes) is replaced; its running workloads are not affected
    :param start_timeout: a helper that is not ready within this counts as unable to start
    :param idle_timeout: ``None``: start the helper with the launcher and keep it, replacing it
        ``restart_delay`` seconds after it dies (doubled each time a replacement dies young); a number: start
        it with the first launch and stop it after that many seconds without a launch (the next
        launch starts a new one), trading the helper's start time for its memory while idle
    :param clock: what every wait is measured on: the watchdog's ticks, the start timeout, the restart
        delay, the idle time
    :param channel_buffer: the socket buffer size asked for each helper's channel; the kernel may grant
        less, and a request that does not fit what it granted goes to the fallback
    :param learning: learn what workloads import and start helpers that preload it; ``None``: only
        ``preload``
    """

    def __init__(
        self,
        *,
        target: str,
        preload: Sequence[str] = (),
        output: OutputSink | None = None,
        fallback: Launcher | None = None,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        ping_interval: float = 5.0,
        ping_timeout: float = 30.0,
        start_timeout: float = 120.0,
        idle_timeout: float | None = None,
        restart_delay: float = 1.0,
        clock: Clock = SYSTEM,
        channel_buffer: int = BUFFER,
        learning: Learning | None = None,
    ) -> None:
        if ":" not in target:
            raise ValueError(f"target must look like module:function, got {target!r}")
        self._spec = HelperSpec(
            python=python,
            target=target,
            preload=tuple(preload),
            output=output or discard,
            env=env,
            channel_buffer=channel_buffer,
            start_timeout=start_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            clock=clock,
            memory_budget=learning.memory_budget if learning is not None else 0,
        )
        self._fallback = fallback
        self._idle_timeout = idle_timeout
        self._restart_delay = restart_delay
        self._clock = clock
        self._learning = learning
        self._helper: HelperProcess | None = None
        self._disabled: str | None = None
        self._down: str | None = None  # why the last start failed, until one succeeds
        self._retry_at = 0.0
        self._retry_delay = restart_delay
        self._lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self.helpers_started = 0

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self._idle_timeout is None:  # warm up now, and whenever the helper dies: its imports take
            self._tg.start_soon(self._keep_warm)  # seconds, better spent before the next workload
        else:
            self._tg.start_soon(self._stop_when_idle, self._idle_timeout)
        if self._learning is not None:
            self._tg.start_soon(self._learning.run, self._grow, self._have)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
        helper = self._helper
        if helper is not None:
            helper.close()
            with self._clock.move_on_after(CLOSE_WAIT, shield=True):
                await helper.gone.wait()
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    @property
    def problem(self) -> str | None:
        if self._disabled is not None:
            return f"fork server unavailable ({self._disabled}); every workload starts a fresh interpreter"
        if self._down is not None:
            return (
                f"fork server could not start ({self._down}); workloads start fresh interpreters until "
                "it is back"
            )
        helper = self._helper
        if self._idle_timeout is None and helper is not None and not helper.alive:
            return f"fork server (pid {helper.pid}) is not running; a new one is starting"
        return None

    @property
    def state(self) -> str:
        """The launch path in words, for the status report."""
        helper = self._helper
        if helper is not None and helper.alive:
            return f"fork server running (pid {helper.pid}, {self.helpers_started} started so far)"
        if helper is None and self._idle_timeout is not None and self._disabled is None:
            return "fork server stopped while idle, until the next workload"
        return self.problem or "fork server starting"

    @property
    def preload(self) -> PreloadSummary | None:  # beyond the target's own imports, for the status
        return describe(self._learning, self._spec.preload)

    def report(self) -> LauncherReport:
        helper = self._helper
        pid = helper.pid if helper is not None and helper.alive else None
        return LauncherReport(self.state, self.problem, self.preload, pid)

    async def launch(self, request: LaunchRequest) -> Child:
        refuse_takeover(request)
        if self._learning is not None:
            self._learning.saw(request.source)
        for _ in range(2):
            helper = await self._current()
            if helper is None:
                why = self._disabled or self._down or "fork server unavailable"
                return await self._launch_fallback(request, why)
            try:
                return await helper.spawn(request)
            except HelperDied:
                continue  # nothing was started for this request: a fresh helper may take it
            except MessageTooLarge as exc:
                # The request's fault, not the helper's: it stays, and takes the next launch.
                return await self._launch_fallback(request, f"its launch request of {exc}", say=True)
            except HelperUnfit as exc:
                helper.close()
                if self._learning is not None and self._learning.learned.preloaded:
                    self._learning.unfit_later(str(exc))  # its successor preloads none of them
                    continue
                # Its successor would run the same preloads: no helper from now on, rather than a loop.
                self._disable(f"the fork server stopped forking: {exc}")
                return await self._launch_fallback(request, str(exc))
        raise LaunchError("fork server died twice while starting this workload")

    async def _keep_warm(self) -> None:
        delay: float | None = None
        while not self._closing:
            helper = await self._current()
            if helper is None:
                if self._disabled is not None:
                    return  # every launch takes the fallback
                await self._clock.sleep(max(0.0, self._retry_at - self._clock.monotonic()))
                continue
            started = self._clock.monotonic()
            await helper.retired.wait()
            if self._closing or self._disabled is not None:
                return
            if self._helper is not None and self._helper.alive:
                delay = None
                continue  # replaced by a helper with more preloaded: nothing to restart
            # A helper that keeps dying soon after it starts (its preload crashing, the OOM killer) is
            # restarted less and less often; launches meanwhile start one on demand anyway.
            lived = self._clock.monotonic() - started
            if delay is None or lived > RESTART_DELAY_MAX:
                delay = self._restart_delay
            else:
                delay = min(delay * 2, RESTART_DELAY_MAX)
            log.info("starting a new fork server in %.1fs", delay)
            await self._clock.sleep(delay)

    async def _stop_when_idle(self, idle: float) -> None:
        while True:
            await self._clock.sleep(min(max(idle / 4, 0.05), 5.0))
            async with self._lock:
                helper = self._helper
                since = helper.idle_since if helper is not None and helper.alive else None
                if helper is None or since is None or self._clock.monotonic() - since < idle:
                    continue
                # A launch that took this helper just before this point sees it go and retries on a
                # new one (see launch()).
                log.info("fork server idle for %.0fs; stopping it until the next workload", idle)
                self._helper = None
                helper.close()
            with self._clock.move_on_after(CLOSE_WAIT):
                await helper.gone.wait()

    async def _launch_fallback(self, request: LaunchRequest, why: str, *, say: bool = False) -> Child:
        if self._fallback is None:
            raise LaunchError(f"cannot launch through the fork server: {why}")
        if say:
            log.warning(
                "workload %s: %s; starting it as a fresh interpreter instead",
                request.label or request.key,
                why,
            )
        return await self._fallback.launch(request)

    def _disable(self, why: str) -> None:
        if self._disabled is None:
            self._disabled = why
            log.warning("%s; launching every workload as a fresh interpreter from now on", why)

    async def _current(self) -> HelperProcess | None:
        async with self._lock:
            if self._helper is not None and self._helper.alive:
                return self._helper
            if self._disabled is not None:
                return None
            if self._down is not None and self._clock.monotonic() < self._retry_at:
                return None  # not on every launch: a start costs seconds of CPU, and may fail the same way
            learning = self._learning
            while True:
                assert self._tg is not None, "use the launcher as an async context manager"
                try:
                    self._helper = await start_helper(
                        self._tg, self._spec, learning.learned.trusted() if learning else None
                    )
                except LearnedModuleFailed as exc:
                    assert learning is not None
                    learning.refuse(exc.module, exc.reason)  # and try again without it
                    continue
                except Exception as exc:  # noqa: BLE001 - any failure here costs launches, never the loop
                    self._start_failed(exc)
                    return None
                self.helpers_started += 1
                if self._down is not None:
                    log.warning("fork server back (pid %d) after: %s", self._helper.pid, self._down)
                    self._down, self._retry_delay = None, self._restart_delay
                else:
                    log.info("fork server ready (pid %d)", self._helper.pid)
                return self._helper

    def _start_failed(self, exc: Exception) -> None:
        if isinstance(exc, LaunchError):
            why = str(exc)
        elif isinstance(exc, OSError):
            why = f"cannot start the fork server: {exc.strerror or exc}"
        else:
            why = f"cannot start the fork server: {type(exc).__name__}: {exc}"
            log.error("starting a fork server failed unexpectedly", exc_info=exc)
        delay = self._retry_delay
        self._retry_delay = min(delay * 2, START_RETRY_MAX)
        self._retry_at = self._clock.monotonic() + delay
        (log.warning if self._down is None else log.info)(
            "%s; workloads start fresh interpreters meanwhile, the fork server is tried again in %.0fs",
            why,
            delay,
        )
        self._down = why

    async def _have(self, modules: list[str]) -> Checked | None:
        """What the serving helper says of ``modules`` (the first one may still be starting)."""
        if self._closing:
            return None
        helper = await self._current() if self._idle_timeout is None else self._helper
        if helper is None or not helper.alive:
            return None
        return await helper.check(modules)

    async def _grow(self, modules: list[str]) -> bool:
        """Start a helper trying ``modules``; ready, it replaces the current one (which served meanwhile)."""
        learning, tg = self._learning, self._tg
        if self._idle_timeout is None:  # the first helper may still be starting: it is the one to replace
            await self._current()
        if learning is None or tg is None or self._closing or self._disabled or self._helper is None:
            return False  # stopped while idle: the next helper starts on demand, with what was taken
        try:
            helper = await start_helper(tg, self._spec, modules)
        except LearnedModuleFailed as exc:
            learning.refuse(exc.module, exc.reason)
            return False
        except Exception as exc:  # noqa: BLE001 - the current helper serves on whatever failed here
            why = exc.strerror if isinstance(exc, OSError) else exc
            log.warning("fork server: no helper with the learned modules (%s); the current one goes on", why)
            return False
        async with self._lock:
            old, self._helper = self._helper, helper
            self.helpers_started += 1
        if (change := learning.took(helper.preload_report or PreloadReport(), modules)) is not None:
            log.info("fork server (pid %d) took over: %s", helper.pid, change)
        if old is not None:  # it takes no new launch; its workloads are the scheduler's children, untouched
            old.close()
        return True
