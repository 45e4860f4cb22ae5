"""The fast launch path: a helper that has imported everything once forks one child per workload.

A fork of a process that already imported the task SDK costs milliseconds; a fresh interpreter costs
about two seconds of CPU. The scheduler itself cannot fork (its event-loop thread makes it
multi-threaded), so the forking happens in a helper started with ``exec``
(:mod:`~async_local_executor.core.launchers.forkserver_helper`, which also documents the protocol).

The helper only forks: each child is the scheduler's own (``CLONE_PARENT``), reports its pid on a
control socket of its own, and is reaped here through a pidfd. So a helper that dies, hangs or is
replaced costs no running workload: requests it had not started are retried on a fresh helper, and
every child it forked runs on and is reported with its real exit status. The helper's liveness is
judged by progress, never by one reply that had to wait behind a busy loop. If a helper cannot start
at all, launches go to the fallback launcher from then on, with one warning.
"""

from __future__ import annotations

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
import anyio.to_thread
import psutil
from typing_extensions import Self

from async_local_executor.core.errors import ChildLost, LaunchError
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, OutputSink
from async_local_executor.core.launchers.forkserver_helper import (
    GO,
    MAX_MESSAGE,
    decode,
    encode,
    size_buffers,
)
from async_local_executor.core.launchers.output import LineSplitter, discard, drain_stream
from async_local_executor.core.launchers.tree import GroupSignaller

log = logging.getLogger(__name__)

HELPER_KEY = "fork-server"  # the key the helper's own output is logged under
# Longest wait before a dead helper is replaced (kept-warm mode); a helper that lived longer than this
# is replaced after restart_delay.
RESTART_DELAY_MAX = 60.0
DRAIN_AFTER_EXIT = 5.0
# A child whose control socket closed without a pid, while the helper said nothing: how long the
# helper's explanation is awaited before the launch is reported failed anyway.
EXPLANATION_WAIT = 10.0


class _HelperDied(Exception):
    """The helper went away before it started this request: safe to retry on a new one."""


@dataclass(eq=False)
class _Spawn:
    """A spawn request the helper has not answered: what the loop learns of it from the channel."""

    resolved: anyio.Event = field(default_factory=anyio.Event)  # the helper refused it, or is gone
    error: str | None = None


def kernel_state(pid: int) -> str:
    """The process's state as the kernel reports it (psutil's names); ``"gone"`` when it does not exist."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "gone"


def _exit_status(result: os.waitid_result) -> int:
    """As :attr:`subprocess.Popen.returncode`: negative ``-N`` when signal N ended it."""
    if result.si_code == os.CLD_EXITED:
        return int(result.si_status)
    return -int(result.si_status)


class _Helper:
    """One helper process, its channel, and the spawn requests it has not answered yet."""

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
        self._heard = 0  # messages received so far: the helper's progress
        self.pid = process.pid
        self.ready = False
        self.start_error: str | None = None
        self.gone = anyio.Event()
        self.retired = anyio.Event()  # set when it must take no new launch (also once it is gone)
        self._closing = False
        self._idle_since = anyio.current_time()

    @property
    def alive(self) -> bool:
        """Takes launches: started, not retired, not gone."""
        return self.ready and not self.retired.is_set()

    @property
    def idle_since(self) -> float | None:
        """When the helper last had no request in flight; ``None`` while it has."""
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
                    self.ready = True
                    task_status.started()
                    tg.start_soon(self._watch)
                    while (message := await self._recv()) is not None:
                        self._dispatch(message)
                    if not self._closing:
                        log.error(
                            "fork server (pid %d) exited; a new one replaces it (running workloads are "
                            "not affected)",
                            self.pid,
                        )
                else:
                    task_status.started()
                tg.cancel_scope.cancel()
        finally:
            self.retired.set()
            self._abandon()
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
        message = encode({"op": "spawn", "id": request_id, "argv": list(request.argv)})
        if len(message) > MAX_MESSAGE:
            raise OverflowError(f"spawn request of {len(message)} bytes exceeds {MAX_MESSAGE}")
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # EMFILE/ENFILE: a launch failure to report, not a crash of ours
            raise LaunchError(f"cannot create the workload's output pipe: {exc.strerror}") from exc
        try:
            control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise LaunchError(f"cannot create the workload's control socket: {exc.strerror}") from exc
        os.set_blocking(read_fd, False)
        control.setblocking(False)
        spawn = _Spawn()
        self._pending[request_id] = spawn
        try:
            try:
                await self._send(message, [write_fd, theirs.fileno()])
            finally:
                # The helper holds its own copies now; EOF on either must depend on the child only.
                os.close(write_fd)
                theirs.close()
            pid = await self._child_pid(control, spawn)
        except BaseException:
            os.close(read_fd)
            control.close()
            raise
        finally:
            self._settle(request_id)
        if pid is None:
            os.close(read_fd)
            control.close()
            if spawn.error is not None:
                raise LaunchError(spawn.error)
            if self.retired.is_set():
                raise _HelperDied
            raise LaunchError("the workload process ended before it could start")
        return await ForkServerChild.adopt(pid, control, read_fd, request, self._output)

    async def _child_pid(self, control: socket.socket, spawn: _Spawn) -> int | None:
        """The pid the child reports on its control socket; ``None`` when the socket closed without one."""
        received = b""
        while b"\n" not in received:
            try:
                chunk = control.recv(64)
            except BlockingIOError:
                await anyio.wait_readable(control)
                continue
            except OSError:
                chunk = b""
            if not chunk:
                # Closed with no pid: the helper refused the request or went away (it closes its copy
                # either way, and then says which on the channel).
                with anyio.move_on_after(EXPLANATION_WAIT):
                    await spawn.resolved.wait()
                return None
            received += chunk
        return int(received.split(b"\n", 1)[0])

    def retire(self, why: str) -> None:
        """Take no new launch and close the channel; run() then kills the process and reaps it.

        The helper owns no workload (each is the scheduler's child), so this costs none of them, and
        requests it had not started see their control sockets close and go to its successor.
        """
        if self.retired.is_set():
            return
        log.error("fork server (pid %d) %s; replacing it (running workloads are not affected)", self.pid, why)
        self.retired.set()
        self.close()

    def close(self) -> None:
        """Close our end of the channel; the helper exits when it sees that."""
        self._closing = True
        self.retired.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    def _dispatch(self, message: dict[str, Any]) -> None:
        self._heard += 1
        if message["op"] != "spawn_failed":
            return  # a pong: progress is all it says
        spawn = self._pending.get(int(message["id"]))
        if spawn is not None:
            spawn.error = str(message.get("error", "spawn failed"))
            spawn.resolved.set()

    def _abandon(self) -> None:
        for spawn in self._pending.values():
            spawn.resolved.set()

    def _read_ready(self) -> None:
        """Dispatch whatever the channel holds now, before judging the helper by it."""
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            self._dispatch(decode(data))

    async def _watch(self) -> None:
        """Retire a helper that makes no progress for ``ping_timeout`` seconds of the loop's own time.

        Each tick counts as one interval however late the loop woke up (a lagging loop could not have
        read an answer either), and the channel is read before the helper is judged.
        """
        silent = 0.0
        heard = self._heard
        while not self.retired.is_set():
            await anyio.sleep(self._ping_interval)
            self._read_ready()
            state = kernel_state(self.pid)
            if state in ("gone", psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return  # the reader sees the channel close and reports it
            if self._heard != heard:
                heard, silent = self._heard, 0.0
            else:
                silent += self._ping_interval
            if silent >= self._ping_timeout:
                self.retire(f"made no progress for {silent:.0f}s (process state: {state})")
                return
            with contextlib.suppress(BlockingIOError, OSError):
                # Never waited on: a channel too full to take a ping is itself a helper not reading.
                self._sock.send(encode({"op": "ping", "id": -1}))

    async def _send(self, data: bytes, fds: list[int]) -> None:
        while True:
            if self.retired.is_set():
                raise _HelperDied
            try:
                socket.send_fds(self._sock, [data], fds)
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
    """A workload process forked by a helper as our own child; the same contract as a subprocess child."""

    def __init__(
        self, pid: int, pidfd: int, read_fd: int, request: LaunchRequest, output: OutputSink
    ) -> None:
        self._pid = pid
        self._pidfd = pidfd
        self._read_fd = read_fd
        self._request = request
        self._output = output
        self._drained = anyio.Event()
        self._signaller = GroupSignaller(pid)

    @classmethod
    async def adopt(
        cls, pid: int, control: socket.socket, read_fd: int, request: LaunchRequest, output: OutputSink
    ) -> ForkServerChild:
        """Take charge of the child that reported ``pid``, then send it its payload (it runs after that)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            # Told nothing, it exits by itself (EXIT_PARENT_GONE); reaped off the loop, it is quick.
            control.close()
            os.close(read_fd)
            await anyio.to_thread.run_sync(os.waitpid, pid, 0)
            raise LaunchError(f"cannot watch the workload process: {exc.strerror}") from exc
        child = cls(pid, pidfd, read_fd, request, output)
        # Shielded: a child that got half its payload would run with a truncated workload.
        with anyio.CancelScope(shield=True):
            await _send_all(control, GO + request.stdin)
        return child

    @property
    def pid(self) -> int:
        return self._pid

    def signal(self, sig: int) -> None:
        self._signaller.send(sig)

    async def wait(self) -> int:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain)
                status = await self._reap()
                # Whatever the child left in its group would outlive the workload and hold the pipe.
                self.signal(signal.SIGKILL)
                with anyio.move_on_after(DRAIN_AFTER_EXIT):
                    await self._drained.wait()
                tg.cancel_scope.cancel()
        finally:
            os.close(self._read_fd)
            os.close(self._pidfd)
        return status

    async def _reap(self) -> int:
        while True:
            try:
                # WNOHANG: returns at once; the pidfd being readable is what says the exit happened.
                result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222
            except ChildProcessError as exc:
                raise ChildLost(f"its exit status was taken by another waiter ({exc})") from exc
            if result is not None:
                return _exit_status(result)
            await anyio.wait_readable(self._pidfd)

    async def _drain(self) -> None:
        splitter = LineSplitter(self._request.key, self._output)
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


async def _send_all(sock: socket.socket, data: bytes) -> None:
    """Write ``data`` and close; a child that is gone already just misses it (its exit tells why)."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[sock.send(view) :]
            except BlockingIOError:
                await anyio.wait_writable(sock)
    except OSError:
        pass
    finally:
        sock.close()


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
    :param ping_timeout: a helper that shows no progress for this long (in ticks of the loop's own
        time) is replaced; its running workloads are not affected
    :param start_timeout: a helper that is not ready within this counts as unable to start
    :param idle_timeout: ``None``: start the helper with the launcher and keep it, replacing it
        ``restart_delay`` seconds after it dies (doubled each time a replacement dies young); a number: start
        it with the first launch and stop it after that many seconds without a launch (the next
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
            await helper.retired.wait()
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
            "async_local_executor.core.launchers.forkserver_helper",
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
        except BaseException:  # cancelled (the loop is going away): nothing owns the channel yet
            ours.close()
            raise
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
        try:
            await self._tg.start(helper.run)
        except BaseException:
            # Cancelled before run() took charge of the helper: it is ours to stop.
            helper.kill()
            ours.close()
            raise
        if helper.start_error is not None:
            await helper.gone.wait()
            raise LaunchError(f"the fork server could not start: {helper.start_error}")
        self.helpers_started += 1
        log.info("fork server ready (pid %d)", helper.pid)
        return helper
