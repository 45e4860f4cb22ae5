"""The helper's server loop: answer the loop's requests, forking one child per workload.

The helper is started (:mod:`.__main__`) as an ordinary ``exec``, never a fork of the multi-threaded
scheduler, and talks over one ``SOCK_SEQPACKET`` socket
(:mod:`~async_local_executor.core.launchers.forkserver.protocol` holds the messages).

Each child is forked with ``CLONE_PARENT``: it is the scheduler's child, not the helper's. So the
scheduler reaps it and reads its real exit status (through a pidfd), the kernel ties its life to the
scheduler's (``PR_SET_PDEATHSIG``), and the helper's own death, replacement or slowness costs no running
workload. A child says its pid itself, over its own control socket, and then receives its payload
there: a child forked by a helper that died before anything was said about it still reports to the
scheduler, so nothing can run unseen (or twice).

Only the standard library is imported: the helper must start fast, and a target's heavy imports
happen once, before the first fork.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable

from async_local_executor.core.launchers.forkserver import protocol
from async_local_executor.core.launchers.forkserver.helper.clone import fork_sibling
from async_local_executor.core.launchers.forkserver.helper.hygiene import reseed_inherited
from async_local_executor.core.launchers.forkserver.helper.preload import check
from async_local_executor.core.launchers.forkserver.helper.threads import ThreadCensus
from async_local_executor.core.launchers.forkserver.protocol import GO, MAX_MESSAGE, decode, encode
from async_local_executor.core.lifeline import EXIT_ORPHANED, die_with_parent

# Signals whose handlers a child must not inherit from the helper.
_RESET_SIGNALS = (
    signal.SIGCHLD,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

Target = Callable[[list[str], bytes], int]

# How long a check's child may take to answer before it is killed and the check answered with nothing.
CHECK_TIMEOUT = 10.0


@dataclasses.dataclass
class _CheckChild:
    """A check being answered by a child of its own."""

    pid: int
    id: int  # the check's
    deadline: float  # time.monotonic() after which it is killed and the check answered with nothing
    chunks: list[bytes] = dataclasses.field(default_factory=list)


class Helper:
    """Serves one channel: a spawn forks a child, a ping or a check is answered; never blocked on a send.

    :param learned: what it made of the learned modules, reported with ``ready``
    :param base: the modules it imported before any learned one (what a check counts as had)
    """

    def __init__(
        self,
        sock: socket.socket,
        target: Target,
        parent_pid: int,
        census: ThreadCensus | None = None,
        learned: protocol.PreloadReport | None = None,
        base: frozenset[str] = frozenset(),
    ) -> None:
        self._learned = learned
        self._base = base
        self._sock = sock
        self._target = target
        self._parent_pid = parent_pid
        self._census = census or ThreadCensus()
        self._outbox: collections.deque[bytes] = collections.deque()
        self._selector = selectors.DefaultSelector()
        self._checks: dict[int, _CheckChild] = {}  # by the read end of its pipe

    def serve(self) -> int:
        """Answer requests until the loop closes the channel."""
        self._sock.setblocking(False)
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._send(protocol.Ready(pid=os.getpid(), preload=self._learned))
        while True:
            # Never blocked on a send: what the loop has not read yet waits here, and requests keep
            # being served meanwhile (a check's answer too: its child is read as it writes).
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._outbox else 0)
            self._selector.modify(self._sock, events)
            deadline = min((c.deadline for c in self._checks.values()), default=None)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            for key, mask in self._selector.select(wait):
                if key.fileobj is not self._sock:
                    self._read_check(key.fd)
                    continue
                if mask & selectors.EVENT_WRITE and not self._flush():
                    return 0
                if mask & selectors.EVENT_READ and not self._receive():
                    return 0
            for fd, pending in list(self._checks.items()):
                if pending.deadline <= time.monotonic():  # a lookup that never returns answers nothing
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pending.pid, signal.SIGKILL)
                    self._answer(fd, None)

    def _receive(self) -> bool:
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
            except BlockingIOError:
                return True
            except (ConnectionResetError, BrokenPipeError):
                return False
            if not data:
                return False
            message = decode(data)
            if isinstance(message, protocol.Spawn):
                self._spawn(message, fds, truncated=bool(flags & socket.MSG_CTRUNC))
            else:
                for fd in fds:
                    os.close(fd)
                if isinstance(message, protocol.Ping):
                    self._send(protocol.Pong(id=message.id))
                elif isinstance(message, protocol.Check):
                    self._check(message)

    def _check(self, message: protocol.Check) -> None:
        """Answered by a child forked for it: what a module's ``__getattr__`` does while it is looked up
        (caching, a thread) stays there, and this helper stays as it was checked at its start."""
        helper = os.getpid()
        sys.stdout.flush()  # or the child would write what is buffered a second time
        sys.stderr.flush()
        read_fd = write_fd = -1
        try:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
        except OSError:  # no answer: the loop then starts the helper it would have started
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            self._send(protocol.Checked(id=message.id, covered=()))
            return
        if pid == 0:
            _answer_check(helper, read_fd, write_fd, message, self._base)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._checks[read_fd] = _CheckChild(pid, message.id, time.monotonic() + CHECK_TIMEOUT)
        self._selector.register(read_fd, selectors.EVENT_READ)

    def _read_check(self, fd: int) -> None:
        pending = self._checks[fd]
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            pending.chunks.append(chunk)
        else:
            self._answer(fd, b"".join(pending.chunks))

    def _answer(self, fd: int, data: bytes | None) -> None:
        """The check's child is done (``data``: all it wrote) or killed (``None``): reap it, answer."""
        pending = self._checks.pop(fd)
        self._selector.unregister(fd)
        os.close(fd)
        with contextlib.suppress(ChildProcessError):  # reaped already (SIGCHLD ignored, a preload's handler)
            os.waitpid(pending.pid, 0)
        nothing = protocol.Checked(id=pending.id, covered=())
        answer: protocol.Message = nothing
        with contextlib.suppress(protocol.ProtocolError):
            answer = decode(data or b"")
        if not isinstance(answer, protocol.Checked):
            answer = nothing
        # An answer the channel cannot take in one datagram loses its reasons first (each refusal's is
        # longer than its name), then everything: the loop then starts the helper it would have started.
        limit = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2
        for smaller in (answer, protocol.Checked(id=pending.id, covered=answer.covered), nothing):
            if len(encoded := encode(smaller)) <= limit:
                self._outbox.append(encoded)
                self._flush()
                return

    def _spawn(self, message: protocol.Spawn, fds: list[int], *, truncated: bool = False) -> None:
        request_id = message.id
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if truncated:  # the kernel dropped the fds it could not install: this table is full
                error = "the fork server's descriptor table is full: the spawn request's fds did not reach it"
                self._send(protocol.SpawnFailed(id=request_id, error=error, full=True))
            else:
                self._send(protocol.SpawnFailed(id=request_id, error="spawn request without its two fds"))
            return
        out_fd, control_fd = fds
        argv = list(message.argv)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = -1
        if (why := self._census.unfit()) is not None:
            # A thread started since startup: this helper must not fork again (the loop stops using it).
            self._send(protocol.SpawnFailed(id=request_id, error=why, unfit=True))
        else:
            try:
                pid = fork_sibling()
            except OSError as exc:
                self._send(protocol.SpawnFailed(id=request_id, error=f"fork failed: {exc.strerror}"))
        if pid == 0:
            _become_child(out_fd, control_fd, argv, self._target, self._parent_pid)
        # The child holds its own copies; once ours are closed, the loop's end of the control socket
        # sees EOF as soon as no child holds it either.
        os.close(out_fd)
        os.close(control_fd)

    def _send(self, message: protocol.ToLoop) -> None:
        self._outbox.append(encode(message))
        self._flush()

    def _flush(self) -> bool:
        while self._outbox:
            try:
                self._sock.send(self._outbox[0])
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno != errno.EMSGSIZE:
                    return False
                # Larger than the channel takes: the loop hears nothing of it (and judges by what it
                # waits for), but the channel, and every spawn after it, is fine.
            self._outbox.popleft()
        return True


def _answer_check(
    helper: int, read_fd: int, write_fd: int, message: protocol.Check, base: frozenset[str]
) -> None:
    """Runs in the child forked for a check and never returns."""
    code = 1
    try:
        os.close(read_fd)
        if not die_with_parent(helper, signal.SIGKILL):  # nobody left to answer
            os._exit(EXIT_ORPHANED)
        covered, refused = check(message.modules, base)
        data = encode(protocol.Checked(id=message.id, covered=tuple(covered), refused=tuple(refused)))
        with open(write_fd, "wb", closefd=True) as out:
            out.write(data)
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happens, the child must end in os._exit
        traceback.print_exc()
    finally:
        os._exit(code)


def _read_payload(control: socket.socket) -> bytes | None:
    """What the loop sends once it knows our pid; ``None`` when it sent nothing (do not run)."""
    chunks = []
    while chunk := control.recv(65536):
        chunks.append(chunk)
    data = b"".join(chunks)
    return data[1:] if data[:1] == GO else None


def _become_child(out_fd: int, control_fd: int, argv: list[str], target: Target, parent_pid: int) -> None:
    """Runs in the forked child and never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, so its whole tree can be signalled
        signal.set_wakeup_fd(-1)
        for sig in _RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Our parent is the scheduler (CLONE_PARENT): we die with it, not with the helper.
        if not die_with_parent(parent_pid, signal.SIGKILL):
            os._exit(EXIT_ORPHANED)
        control = socket.socket(fileno=control_fd)
        control.setblocking(True)
        control.sendall(f"{os.getpid()}\n".encode())
        stdin = _read_payload(control)
        control.close()
        if stdin is None:
            os._exit(EXIT_ORPHANED)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        # Nothing of the helper's (its channel, the fds of other requests) is the child's business.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        reseed_inherited()  # before any workload code: its draws are its own, as in a fresh process
        code = target(argv, stdin)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must end in os._exit
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
