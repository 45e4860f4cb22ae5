"""The fork server's far side: a long-lived helper that imports once and forks one child per workload.

Started by :mod:`async_local_executor.launchers.forkserver` as an ordinary ``exec`` (never a fork of the
multi-threaded scheduler). It talks over one ``SOCK_SEQPACKET`` socket, one JSON object per message, so
message boundaries hold and each spawn request carries its own output pipe as an ``SCM_RIGHTS`` fd:

    loop -> helper   {"op": "spawn", "id", "argv", "stdin": base64}  + [write end of the child's output pipe]
                     {"op": "ping", "id"}
    helper -> loop   {"op": "ready", "pid"}
                     {"op": "started", "id", "pid"} | {"op": "spawn_failed", "id", "error"}
                     {"op": "exited", "id", "pid", "status"}     (status: negative = killed by that signal)
                     {"op": "pong", "id"}

Only the standard library is imported at module level: this file also runs in processes that must start
fast, and a target's heavy imports happen once, in :func:`main`, before the first fork.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from async_local_executor.lifeline import die_with_parent

# SEQPACKET messages are bounded by the socket buffers; both ends raise them to this, and a larger
# spawn request goes through the plain launcher instead.
MAX_MESSAGE = 1024 * 1024
EXIT_PARENT_GONE = 3
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


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict) or "op" not in message:
        raise ValueError(f"not a fork-server message: {data[:80]!r}")
    return message


def resolve(target: str) -> Target:
    """Import ``module:function``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target must look like module:function, got {target!r}")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn  # type: ignore[no-any-return]


def size_buffers(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE + 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE + 4096)


class Helper:
    def __init__(self, sock: socket.socket, target: Target) -> None:
        self._sock = sock
        self._target = target
        self._children: dict[int, int] = {}  # pid -> request id

    def serve(self) -> int:
        """Answer requests until the loop closes the channel."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # SIGCHLD only needs to wake select(); set_wakeup_fd does that, the handler itself does nothing.
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        self._send({"op": "ready", "pid": os.getpid()})
        while True:
            # The timeout is a backstop for a lost wakeup; reaping is cheap when nothing exited.
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is self._sock:
                    if not self._receive():
                        return 0
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 4096):
                            pass
            self._reap()

    def _receive(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
        except (ConnectionResetError, BrokenPipeError):
            return False
        if not data:
            return False
        message = decode(data)
        op = message["op"]
        if op == "spawn":
            self._spawn(message, fds)
        else:
            for fd in fds:
                os.close(fd)
            if op == "ping":
                self._send({"op": "pong", "id": message["id"]})
        return True

    def _spawn(self, message: dict[str, Any], fds: list[int]) -> None:
        request_id = int(message["id"])
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self._send(
                {"op": "spawn_failed", "id": request_id, "error": "spawn request without an output fd"}
            )
            return
        [out_fd] = fds
        argv = [str(a) for a in message["argv"]]
        stdin = base64.b64decode(message.get("stdin", ""))
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(out_fd)
            self._send({"op": "spawn_failed", "id": request_id, "error": f"fork failed: {exc.strerror}"})
            return
        if pid == 0:
            _become_child(out_fd, argv, stdin, self._target)
        os.close(out_fd)
        # Both sides set the group (the classic race-free idiom): a signal sent to it as soon as the
        # loop hears "started" must reach the child, whichever of the two runs first.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(pid, pid)
        self._children[pid] = request_id
        self._send({"op": "started", "id": request_id, "pid": pid})

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            request_id = self._children.pop(pid, None)
            if request_id is not None:
                code = os.waitstatus_to_exitcode(status)
                self._send({"op": "exited", "id": request_id, "pid": pid, "status": code})

    def _send(self, message: dict[str, Any]) -> None:
        # Blocking is safe: the loop reads this socket continuously, whatever else it does.
        self._sock.send(encode(message))


def _become_child(out_fd: int, argv: list[str], stdin: bytes, target: Target) -> None:
    """Runs in the forked child and never returns."""
    code = 1
    try:
        helper_pid = os.getppid()
        os.setpgid(0, 0)  # its own process group, so its whole tree can be signalled
        signal.set_wakeup_fd(-1)
        for sig in _RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Parent is the helper, which dies with the executor; a child must not outlive either.
        if not die_with_parent(helper_pid, signal.SIGKILL):
            os._exit(EXIT_PARENT_GONE)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        # Nothing of the helper's (its channel, its wakeup pipe) is the child's business.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_local_executor.launchers.forkserver_helper")
    parser.add_argument("--fd", type=int, required=True, help="the SOCK_SEQPACKET channel")
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--target", required=True, help="module:function run in each child")
    parser.add_argument("--preload", action="append", default=[], help="module to import before forking")
    args = parser.parse_args(argv)
    # Its own process group, so a terminal's Ctrl-C reaches the scheduler alone (which shuts us down
    # in order), but the scheduler's session: Linux shares CPU fairly between sessions (autogroups),
    # and the workloads must compete for CPU as the scheduler's work, as stock's workers do, not as
    # a second session that gets as much CPU as the scheduler, the api-server and every other one.
    with contextlib.suppress(PermissionError):  # already a group leader
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent(args.parent_pid):
        return EXIT_PARENT_GONE
    sock = socket.socket(fileno=args.fd)
    size_buffers(sock)
    target = resolve(args.target)
    # The target's module may name its own heavy imports; everything imported now is shared
    # copy-on-write by every child.
    owner = sys.modules[target.__module__]
    if callable(preload := getattr(owner, "preload", None)):
        preload()
    for module in args.preload:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a bad preload entry costs speed, not correctness
            print(
                f"fork server: cannot preload {module!r}, skipping it: {exc!r}", file=sys.stderr, flush=True
            )
    # Moved to a permanent generation, the imported objects are never touched by a child's GC, so
    # their pages stay shared.
    gc.collect()
    gc.freeze()
    return Helper(sock, target).serve()


if __name__ == "__main__":
    sys.exit(main())
