"""One fork-server helper as the loop sees it: its start, its handshake, its spawn requests, its watchdog.

The helper only forks; each child is the scheduler's own (``CLONE_PARENT``), reports its pid on a
control socket of its own, and is reaped here through a pidfd. So a helper that dies, hangs or is
retired costs no running workload: a request it had not started raises :class:`HelperDied`, for the
launcher to retry on a fresh helper. Its liveness is judged by progress, never by one reply that had
to wait behind a busy loop.

The helper imports the target's module, the explicit preloads and, when given a plan, the learned
modules one by one (:mod:`~async_local_executor.core.launchers.forkserver.helper.preload`). A helper that
could not start because of a learned module (it said which one started a thread, or it crashed or
hung while importing one) raises :class:`LearnedModuleFailed`, naming the module, so the launcher can
refuse that module and keep everything else. Every wait here is on the launcher's clock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc
import psutil

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import DescriptorsFull, LaunchError, launch_error
from async_local_executor.core.launchers.base import HELPER_KEY, LaunchRequest, OutputSink, open_process
from async_local_executor.core.launchers.forkserver import LOGGER, protocol
from async_local_executor.core.launchers.forkserver.channel import Channel, ChannelClosed, MessageTooLarge
from async_local_executor.core.launchers.forkserver.child import ForkServerChild
from async_local_executor.core.launchers.output import LineSplitter, drain_stream

log = logging.getLogger(LOGGER)

# How long a helper's explanation is awaited for a child whose control socket closed without a pid.
EXPLANATION_WAIT = 10.0
# How long a killed helper is awaited before its process is closed anyway.
REAP_WAIT = 10.0


class HelperDied(Exception):
    """The helper went away before it started this request: safe to retry on a new one."""


class HelperUnfit(LaunchError):
    """The helper refused to fork because it is no longer single-threaded; it will refuse every request."""


class LearnedModuleFailed(LaunchError):
    """The helper could not start because of one learned module."""

    def __init__(self, module: str, reason: str) -> None:
        super().__init__(f"{module}: {reason}")
        self.module = module
        self.reason = reason


@dataclass(frozen=True)
class HelperSpec:
    """How every helper of one launcher is started."""

    python: str
    target: str
    preload: Sequence[str]
    output: OutputSink
    env: Mapping[str, str] | None
    channel_buffer: int
    start_timeout: float
    ping_interval: float
    ping_timeout: float
    clock: Clock
    memory_budget: int = 0  # bytes the learned modules may add to a helper; 0: no limit


@dataclass(eq=False)
class _Pending:
    """A spawn request the helper has not answered: what the loop learns of it from the channel."""

    resolved: anyio.Event = field(default_factory=anyio.Event)  # the helper refused it, or is gone
    error: str | None = None
    unfit: bool = False  # refused because the helper must fork nothing more
    full: bool = False  # refused because the helper's descriptor table was full


@dataclass(eq=False)
class _Question:
    """A check the helper has not answered."""

    answered: anyio.Event = field(default_factory=anyio.Event)  # or the helper is gone
    answer: protocol.Checked | None = None


def kernel_state(pid: int) -> str:
    """The process's state as the kernel reports it (psutil's names); ``"gone"`` when it does not exist."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "gone"


class HelperProcess:
    """One helper process, its channel, and the spawn requests it has not answered yet."""

    def __init__(
        self,
        process: anyio.abc.Process,
        channel: Channel,
        output: OutputSink,
        *,
        start_timeout: float,
        ping_interval: float,
        ping_timeout: float,
        clock: Clock = SYSTEM,
        plan: protocol.Plan | None = None,
    ) -> None:
        self.process, self._plan = process, plan  # the plan to send it first, if any
        self.importing: str | None = None  # the learned module it said it is importing (during startup)
        self.blame: str | None = None  # the learned module it refused to fork after
        self.preload_report: protocol.PreloadReport | None = None
        self._channel = channel
        self._output = output
        self._start_timeout = start_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._clock = clock
        self._ids = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._questions: dict[int, _Question] = {}
        self._heard = 0  # messages received so far: the helper's progress
        self.pid = process.pid
        self.ready = False
        self.start_error: str | None = None
        self.gone = anyio.Event()
        self.retired = anyio.Event()  # set when it must take no new launch (also once it is gone)
        self._closing = False
        self._idle_since = clock.monotonic()

    @property
    def alive(self) -> bool:
        """Takes launches: started, not retired, not gone."""
        return self.ready and not self.retired.is_set()

    @property
    def idle_since(self) -> float | None:
        """When (the clock's monotonic time) it last had no request in flight; ``None`` while it has."""
        return None if self._pending else self._idle_since

    def _settle(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        if not self._pending:
            self._idle_since = self._clock.monotonic()

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
                    while (message := await self._channel.receive()) is not None:
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
        with self._clock.move_on_after(self._start_timeout):
            if self._plan is not None:
                with contextlib.suppress(ChannelClosed):
                    await self._channel.send(self._channel.frame(self._plan), [], unless=self.retired)
            while isinstance(message := await self._channel.receive(), protocol.Importing):
                self.importing = message.module
            if message is None:
                return "it exited during startup (its output is in the log above)"
            if isinstance(message, protocol.Unfit):
                self.preload_report = message.preload
                self.blame = message.blame
                return message.error
            if not isinstance(message, protocol.Ready):
                return f"unexpected first message {message!r}"
            self.preload_report = message.preload
            self.pid = message.pid
            return None
        return f"it was not ready within {self._start_timeout:.0f}s"

    async def spawn(self, request: LaunchRequest) -> ForkServerChild:
        request_id = next(self._ids)
        message = self._channel.frame(protocol.Spawn(id=request_id, argv=tuple(request.argv)))
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # EMFILE/ENFILE: the workload waits (DescriptorsFull), not a crash of ours
            raise launch_error("cannot create the workload's output pipe", exc) from exc
        try:
            control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise launch_error("cannot create the workload's control socket", exc) from exc
        os.set_blocking(read_fd, False)
        control.setblocking(False)
        spawn = _Pending()
        self._pending[request_id] = spawn
        try:
            try:
                await self._channel.send(message, [write_fd, theirs.fileno()], unless=self.retired)
            except ChannelClosed as exc:
                # A broken channel is proof the helper is gone: the retry must not pick it again
                # before the reader has seen the channel close.
                self.retired.set()
                raise HelperDied from exc
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
                raise (HelperUnfit if spawn.unfit else DescriptorsFull if spawn.full else LaunchError)(
                    spawn.error
                )
            if self.retired.is_set():
                raise HelperDied
            raise LaunchError("the workload process ended before it could start")
        return await ForkServerChild.adopt(pid, control, read_fd, request, self._output, self._clock)

    async def check(self, modules: Sequence[str]) -> protocol.Checked | None:
        """Which of ``modules`` this helper has already, and which no helper would preload; ``None``: no
        answer (it imports nothing to answer).

        Asked before a helper that preloads them is started: one that would add nothing is not worth
        seconds of CPU. A helper that cannot answer within ``ping_timeout`` is the watchdog's to judge.
        """
        question_id = next(self._ids)
        question = self._questions[question_id] = _Question()
        try:
            with self._clock.move_on_after(self._ping_timeout):
                message = self._channel.frame(protocol.Check(id=question_id, modules=tuple(modules)))
                await self._channel.send(message, [], unless=self.retired)
                await question.answered.wait()
        except (ChannelClosed, MessageTooLarge):
            return None
        finally:
            self._questions.pop(question_id, None)
        return question.answer

    async def _child_pid(self, control: socket.socket, spawn: _Pending) -> int | None:
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
                with self._clock.move_on_after(EXPLANATION_WAIT):
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
        self._channel.shutdown()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    def _dispatch(self, message: protocol.Message) -> None:
        self._heard += 1
        if isinstance(message, protocol.Checked):
            if (question := self._questions.get(message.id)) is not None:
                question.answer = message
                question.answered.set()
            return
        if not isinstance(message, protocol.SpawnFailed):
            return  # a pong: progress is all it says
        spawn = self._pending.get(message.id)
        if spawn is not None:
            spawn.error = message.error
            spawn.unfit = message.unfit
            spawn.full = message.full
            spawn.resolved.set()

    def _abandon(self) -> None:
        for spawn in self._pending.values():
            spawn.resolved.set()
        for question in self._questions.values():
            question.answered.set()

    async def _watch(self) -> None:
        """Retire a helper that makes no progress for ``ping_timeout`` seconds, counted in ticks.

        Each tick counts as one interval however late the loop woke up (a lagging loop could not have
        read an answer either), and the channel is read before the helper is judged.
        """
        silent = 0.0
        heard = self._heard
        while not self.retired.is_set():
            await self._clock.sleep(self._ping_interval)
            for message in self._channel.received():
                self._dispatch(message)
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
            # Never waited on: a channel too full to take a ping is itself a helper not reading.
            self._channel.offer(protocol.Ping(id=-1))

    async def _drain_own_output(self) -> None:
        await drain_stream(self.process.stdout, LineSplitter(HELPER_KEY, self._output))

    async def _reap(self) -> None:
        self.kill()
        with self._clock.move_on_after(REAP_WAIT):
            await self.process.wait()
        with contextlib.suppress(Exception):
            await self.process.aclose()
        self._channel.close()


async def start_helper(
    tg: anyio.abc.TaskGroup, spec: HelperSpec, learned: Sequence[str] | None = None
) -> HelperProcess:
    """A ready helper, served in ``tg``.

    :param learned: learned modules for it to try (``None``: it is told of none)
    :raises LearnedModuleFailed: a learned module kept it from starting
    :raises LaunchError: it could not start for another reason
    """
    channel, theirs = Channel.pair(buffer=spec.channel_buffer)
    argv = [
        spec.python,
        "-m",
        "async_local_executor.core.launchers.forkserver.helper",
        "--fd",
        str(theirs.fileno()),
        "--parent-pid",
        str(os.getpid()),
        "--target",
        spec.target,
    ]
    for module in spec.preload:
        argv += ["--preload", module]
    plan = None
    if learned is not None:
        argv.append("--learned")
        plan = protocol.Plan(modules=tuple(learned), budget=spec.memory_budget)
    try:
        process = await open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()],
            env=spec.env,
        )
    except OSError as exc:
        channel.close()
        raise LaunchError(f"cannot start the fork server: {exc.strerror}") from exc
    except BaseException:  # cancelled (the loop is going away): nothing owns the channel yet
        channel.close()
        raise
    finally:
        theirs.close()
    helper = HelperProcess(
        process,
        channel,
        spec.output,
        start_timeout=spec.start_timeout,
        ping_interval=spec.ping_interval,
        ping_timeout=spec.ping_timeout,
        clock=spec.clock,
        plan=plan,
    )
    try:
        await tg.start(helper.run)
    except BaseException:
        # Cancelled before run() took charge of the helper: it is ours to stop.
        helper.kill()
        channel.close()
        raise
    if helper.start_error is not None:
        await helper.gone.wait()
        blamed = helper.blame or helper.importing
        if blamed is not None:
            raise LearnedModuleFailed(blamed, helper.start_error)
        raise LaunchError(f"the fork server could not start: {helper.start_error}")
    return helper
