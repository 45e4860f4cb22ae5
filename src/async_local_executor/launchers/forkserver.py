"""The fast launch path: a helper that has imported everything once forks one child per workload.

A fork of a process that already imported the task SDK costs milliseconds; a fresh interpreter costs
about two seconds of CPU. The scheduler itself cannot fork (its event-loop thread makes it
multi-threaded), so the forking happens in a helper started with ``exec``
(:mod:`~async_local_executor.launchers.forkserver_helper`, which also documents the protocol).

The event loop reads the helper's channel continuously, so neither side can block on a full buffer.
If the helper dies, children that had started are killed with their process groups and reported lost;
requests not yet started are retried on a fresh helper. If a helper cannot start at all, launches go
to the fallback launcher from then on, with one warning.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from typing_extensions import Self

from async_local_executor.errors import ChildLost, LaunchError
from async_local_executor.launchers.base import Child, Launcher, LaunchRequest, OutputSink
from async_local_executor.launchers.forkserver_helper import MAX_MESSAGE, decode, encode, size_buffers
from async_local_executor.launchers.output import LineSplitter, discard, drain_stream
from async_local_executor.launchers.tree import GroupSignaller

log = logging.getLogger(__name__)

HELPER_KEY = "fork-server"  # the key the helper's own output is logged under
# Longest wait before a dead helper is replaced (kept-warm mode); a helper that lived longer than this
# is replaced after restart_delay.
RESTART_DELAY_MAX = 60.0
DRAIN_AFTER_EXIT = 5.0


class _HelperDied(Exception):
    """The helper went away before it started this request: safe to retry on a new one."""


@dataclass(eq=False)
class _Spawn:
    request: LaunchRequest
    started: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)
    pid: int | None = None
    status: int | None = None
    error: str | None = None
    helper_died: bool = False
    lost: str | None = None


class _Helper:
    """One helper process, its channel, and the requests it has in flight."""

    def __init__(
        self,
        process: anyio.abc.Process,
        sock: socket.socket,
        output: OutputSink,
        *,
        start_timeout: float,
        ping_interval: float,
        ping_timeout: float,
    ) -> None:
        self.process = process
        self._sock = sock
        self._output = output
        self._start_timeout = start_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._ids = itertools.count()
        self._pending: dict[int, _Spawn] = {}
        self._pong = anyio.Event()
        self.pid = process.pid
        self.alive = False
        self.start_error: str | None = None
        self.gone = anyio.Event()
        self._closing = False
        self._idle_since = anyio.current_time()

    @property
    def idle_since(self) -> float | None:
        """When the helper last had nothing in flight; ``None`` while it has."""
        return None if self._pending else self._idle_since

    def _settle(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        if not self._pending:
            self._idle_since = anyio.current_time()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve the channel until the helper goes away; reports started once it is ready (or failed)."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain_own_output)
                self.start_error = await self._handshake()
                if self.start_error is None:
                    self.alive = True
                    task_status.started()
                    tg.start_soon(self._pinger)
                    while (message := await self._recv()) is not None:
                        self._dispatch(message)
                    if not self._closing:
                        log.error(
                            "fork server died (pid %d); its in-flight workloads are lost, a new one "
                            "replaces it",
                            self.pid,
                        )
                        self._abandon("fork server died")
                else:
                    task_status.started()
                tg.cancel_scope.cancel()
        finally:
            self.alive = False
            self._abandon("fork server died")
            with anyio.CancelScope(shield=True):
                await self._reap()
            self.gone.set()

    async def _handshake(self) -> str | None:
        with anyio.move_on_after(self._start_timeout):
            message = await self._recv()
            if message is None:
                return "it exited during startup (its output is in the log above)"
            if message.get("op") != "ready":
                return f"unexpected first message {message!r}"
            self.pid = int(message["pid"])
            return None
        return f"it was not ready within {self._start_timeout:.0f}s"

    async def spawn(self, request: LaunchRequest) -> ForkServerChild:
        request_id = next(self._ids)
        message = encode(
            {
                "op": "spawn",
                "id": request_id,
                "argv": list(request.argv),
                "stdin": base64.b64encode(request.stdin).decode(),
            }
        )
        if len(message) > MAX_MESSAGE:
            raise OverflowError(f"spawn request of {len(message)} bytes exceeds {MAX_MESSAGE}")
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # EMFILE/ENFILE: a launch failure to report, not a crash of ours
            raise LaunchError(f"cannot create the workload's output pipe: {exc.strerror}") from exc
        os.set_blocking(read_fd, False)
        spawn = _Spawn(request)
        self._pending[request_id] = spawn
        try:
            try:
                await self._send(message, write_fd)
            finally:
                os.close(write_fd)  # the helper holds its own copy now; EOF must depend on the child only
            await spawn.started.wait()
        except BaseException:
            os.close(read_fd)
            self._settle(request_id)
            raise
        if spawn.helper_died:
            os.close(read_fd)
            raise _HelperDied
        if spawn.error is not None:
            os.close(read_fd)
            raise LaunchError(spawn.error)
        return ForkServerChild(spawn, read_fd, self._output)

    def close(self) -> None:
        """Close our end of the channel; the helper exits when it sees that."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "pong":
            self._pong.set()
            return
        spawn = self._pending.get(int(message["id"]))
        if spawn is None:
            log.warning("fork server sent a message for an unknown request: %s", message)
            return
        if op == "started":
            spawn.pid = int(message["pid"])
            spawn.started.set()
        elif op == "spawn_failed":
            spawn.error = str(message.get("error", "spawn failed"))
            self._settle(int(message["id"]))
            spawn.started.set()
        elif op == "exited":
            spawn.status = int(message["status"])
            self._settle(int(message["id"]))
            spawn.exited.set()

    def _abandon(self, reason: str) -> None:
        for spawn in self._pending.values():
            if spawn.pid is None:
                spawn.helper_died = True
                spawn.started.set()
            else:
                # The child got SIGKILL from the kernel when the helper died (PDEATHSIG); its own
                # children did not, so the group goes too. Its status died with the helper.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(spawn.pid, signal.SIGKILL)
                spawn.lost = reason
                spawn.exited.set()
        self._pending.clear()

    async def _pinger(self) -> None:
        while True:
            await anyio.sleep(self._ping_interval)
            self._pong = anyio.Event()
            try:
                await self._send(encode({"op": "ping", "id": -1}))
            except _HelperDied:
                return  # the reader sees the same and cleans up
            with anyio.move_on_after(self._ping_timeout) as scope:
                await self._pong.wait()
            if scope.cancelled_caught:
                log.error(
                    "fork server (pid %d) did not answer within %.0fs; killing it",
                    self.pid,
                    self._ping_timeout,
                )
                self.kill()
                return

    async def _send(self, data: bytes, fd: int | None = None) -> None:
        while True:
            try:
                if fd is None:
                    self._sock.send(data)
                else:
                    socket.send_fds(self._sock, [data], [fd])
                return
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
            except OSError as exc:
                raise _HelperDied from exc

    async def _recv(self) -> dict[str, Any] | None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError:
                return None
            return decode(data) if data else None

    async def _drain_own_output(self) -> None:
        await drain_stream(self.process.stdout, LineSplitter(HELPER_KEY, self._output))

    async def _reap(self) -> None:
        self.kill()
        with anyio.move_on_after(10):
            await self.process.wait()
        with contextlib.suppress(Exception):
            await self.process.aclose()
        self._sock.close()


class ForkServerChild:
    """A workload process forked by the helper; the same contract as a plain subprocess child."""

    def __init__(self, spawn: _Spawn, read_fd: int, output: OutputSink) -> None:
        assert spawn.pid is not None
        self._spawn = spawn
        self._pid = spawn.pid
        self._read_fd = read_fd
        self._output = output
        self._drained = anyio.Event()
        self._signaller = GroupSignaller(self._pid)

    @property
    def pid(self) -> int:
        return self._pid

    def signal(self, sig: int) -> None:
        self._signaller.send(sig)

    async def wait(self) -> int:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain)
                await self._spawn.exited.wait()
                # Whatever the child left in its group would outlive the workload and hold the pipe.
                self.signal(signal.SIGKILL)
                with anyio.move_on_after(DRAIN_AFTER_EXIT):
                    await self._drained.wait()
                tg.cancel_scope.cancel()
        finally:
            os.close(self._read_fd)
        if self._spawn.lost is not None:
            raise ChildLost(self._spawn.lost)
        assert self._spawn.status is not None
        return self._spawn.status

    async def _drain(self) -> None:
        splitter = LineSplitter(self._spawn.request.key, self._output)
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, 65536)
                except BlockingIOError:
                    await anyio.wait_readable(self._read_fd)
                    continue
                if not chunk:
                    return
                splitter.feed(chunk)
        finally:
            splitter.close()
            self._drained.set()


class ForkServerLauncher:
    """Launches workloads through a fork-server helper, restarting it when it dies.

    :param target: ``module:function`` run in each child with ``(argv, stdin_bytes)``; its module may
        define ``preload()``, called once in the helper before the first fork
    :param preload: more modules the helper imports before forking (heavy libraries DAGs use)
    :param output: receives each line a child writes
    :param fallback: used for every launch once a helper cannot start, and for requests too large for
        the channel
    :param env: the helper's environment, which every child inherits; ``None`` to inherit ours
    :param ping_interval: seconds between liveness checks of the helper
    :param ping_timeout: a helper that does not answer a check within this is killed and replaced
    :param start_timeout: a helper that is not ready within this counts as unable to start
    :param idle_timeout: ``None``: start the helper with the launcher and keep it, replacing it
        ``restart_delay`` seconds after it dies (doubled each time a replacement dies young); a number: start
        it with the first launch and stop it after that many seconds with nothing in flight (the next
        launch starts a new one), trading the helper's start time for its memory while idle
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
    ) -> None:
        if ":" not in target:
            raise ValueError(f"target must look like module:function, got {target!r}")
        self._target = target
        self._preload = tuple(preload)
        self._output = output or discard
        self._fallback = fallback
        self._python = python
        self._env = env
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._start_timeout = start_timeout
        self._idle_timeout = idle_timeout
        self._restart_delay = restart_delay
        self._helper: _Helper | None = None
        self._disabled: str | None = None
        self._lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self.helpers_started = 0

    @property
    def helper_pid(self) -> int | None:
        helper = self._helper
        return helper.pid if helper is not None and helper.alive else None

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self._idle_timeout is None:
            # Warm up now, and again whenever the helper dies: its imports take seconds, better spent
            # before the next workload than in its launch (and an idle scheduler stays healthy).
            self._tg.start_soon(self._keep_warm)
        else:
            self._tg.start_soon(self._stop_when_idle, self._idle_timeout)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
        helper = self._helper
        if helper is not None:
            helper.close()
            with anyio.move_on_after(10, shield=True):
                await helper.gone.wait()
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    @property
    def problem(self) -> str | None:
        if self._disabled is not None:
            return f"fork server unavailable ({self._disabled}); every workload starts a fresh interpreter"
        helper = self._helper
        if self._idle_timeout is None and helper is not None and not helper.alive:
            return f"fork server (pid {helper.pid}) is not running; a new one is starting"
        return None

    async def launch(self, request: LaunchRequest) -> Child:
        for _ in range(2):
            helper = await self._current()
            if helper is None:
                return await self._launch_fallback(request, self._disabled or "fork server unavailable")
            try:
                return await helper.spawn(request)
            except _HelperDied:
                continue  # nothing was started for this request: a fresh helper may take it
            except OverflowError as exc:
                return await self._launch_fallback(request, str(exc))
        raise LaunchError("fork server died twice while starting this workload")

    async def _keep_warm(self) -> None:
        delay: float | None = None
        while not self._closing:
            helper = await self._current()
            if helper is None:
                return  # disabled: every launch takes the fallback
            started = anyio.current_time()
            await helper.gone.wait()
            if self._closing:
                return
            # A helper that keeps dying soon after it starts (its preload crashing, the OOM killer) is
            # restarted less and less often; launches meanwhile start one on demand anyway.
            lived = anyio.current_time() - started
            if delay is None or lived > RESTART_DELAY_MAX:
                delay = self._restart_delay
            else:
                delay = min(delay * 2, RESTART_DELAY_MAX)
            log.info("starting a new fork server in %.1fs", delay)
            await anyio.sleep(delay)

    async def _stop_when_idle(self, idle: float) -> None:
        while True:
            await anyio.sleep(min(max(idle / 4, 0.05), 5.0))
            async with self._lock:
                helper = self._helper
                since = helper.idle_since if helper is not None and helper.alive else None
                if helper is None or since is None or anyio.current_time() - since < idle:
                    continue
                # A launch that took this helper just before this point sees it go and retries on a
                # new one (see launch()).
                log.info("fork server idle for %.0fs; stopping it until the next workload", idle)
                self._helper = None
                helper.close()
            with anyio.move_on_after(10):
                await helper.gone.wait()

    async def _launch_fallback(self, request: LaunchRequest, why: str) -> Child:
        if self._fallback is None:
            raise LaunchError(f"cannot launch through the fork server: {why}")
        return await self._fallback.launch(request)

    async def _current(self) -> _Helper | None:
        async with self._lock:
            if self._helper is not None and self._helper.alive:
                return self._helper
            if self._disabled is not None:
                return None
            try:
                self._helper = await self._start_helper()
            except LaunchError as exc:
                self._disabled = str(exc)
                log.warning("%s; launching every workload as a fresh interpreter from now on", exc)
                return None
            return self._helper

    async def _start_helper(self) -> _Helper:
        assert self._tg is not None, "use the launcher as an async context manager"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        size_buffers(ours)
        ours.setblocking(False)
        argv = [
            self._python,
            "-m",
            "async_local_executor.launchers.forkserver_helper",
            "--fd",
            str(theirs.fileno()),
            "--parent-pid",
            str(os.getpid()),
            "--target",
            self._target,
        ]
        for module in self._preload:
            argv += ["--preload", module]
        try:
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()],
                env=self._env,
            )
        except OSError as exc:
            ours.close()
            raise LaunchError(f"cannot start the fork server: {exc.strerror}") from exc
        finally:
            theirs.close()
        helper = _Helper(
            process,
            ours,
            self._output,
            start_timeout=self._start_timeout,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
        )
        await self._tg.start(helper.run)
        if helper.start_error is not None:
            await helper.gone.wait()
            raise LaunchError(f"the fork server could not start: {helper.start_error}")
        self.helpers_started += 1
        log.info("fork server ready (pid %d)", helper.pid)
        return helper
