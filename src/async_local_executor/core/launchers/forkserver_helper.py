"""The fork server's far side: a long-lived helper that imports once and forks one child per workload.

Started by :mod:`async_local_executor.core.launchers.forkserver` as an ordinary ``exec`` (never a fork of the
multi-threaded scheduler). It talks over one ``SOCK_SEQPACKET`` socket
(:mod:`~async_local_executor.core.launchers.forkserver_protocol` documents the messages).

Each child is forked with ``CLONE_PARENT``: it is the scheduler's child, not the helper's. So the
scheduler reaps it and reads its real exit status (through a pidfd), the kernel ties its life to the
scheduler's (``PR_SET_PDEATHSIG``), and the helper's own death, replacement or slowness costs no running
workload. A child says its pid itself, over its own control socket, and then receives its payload
there: a child forked by a helper that died before anything was said about it still reports to the
scheduler, so nothing can run unseen (or twice).

Only the standard library is imported at module level: this file also runs in processes that must start
fast, and a target's heavy imports happen once, in :func:`main`, before the first fork.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from async_local_executor.core.launchers.forkserver_clone import fork_sibling, sibling_fork_supported
from async_local_executor.core.launchers.forkserver_hygiene import ImportWatch, reseed_inherited
from async_local_executor.core.launchers.forkserver_pools import stop_known_pools
from async_local_executor.core.launchers.forkserver_preload import Unfit, preload_learned
from async_local_executor.core.launchers.forkserver_protocol import (
    GO,
    MAX_MESSAGE,
    decode,
    encode,
    size_buffers,
)
from async_local_executor.core.launchers.forkserver_threads import ThreadCensus
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

# How long the startup check waits for Python threads that a preload started for a one-off job.
THREAD_SETTLE = 1.0


def resolve(target: str) -> Target:
    """Import ``module:function``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target must look like module:function, got {target!r}")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn  # type: ignore[no-any-return]


class Helper:
    def __init__(
        self,
        sock: socket.socket,
        target: Target,
        parent_pid: int,
        census: ThreadCensus | None = None,
        learned: dict[str, Any] | None = None,
    ) -> None:
        self._learned = learned
        self._sock = sock
        self._target = target
        self._parent_pid = parent_pid
        self._census = census or ThreadCensus()
        self._outbox: collections.deque[bytes] = collections.deque()

    def serve(self) -> int:
        """Answer requests until the loop closes the channel."""
        self._sock.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        ready: dict[str, Any] = {"op": "ready", "pid": os.getpid()}
        if self._learned is not None:
            ready["preload"] = self._learned
        self._send(ready)
        while True:
            # Never blocked on a send: what the loop has not read yet waits here, and requests keep
            # being served meanwhile.
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._outbox else 0)
            selector.modify(self._sock, events)
            for _, mask in selector.select():
                if mask & selectors.EVENT_WRITE and not self._flush():
                    return 0
                if mask & selectors.EVENT_READ and not self._receive():
                    return 0

    def _receive(self) -> bool:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
            except BlockingIOError:
                return True
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

    def _spawn(self, message: dict[str, Any], fds: list[int]) -> None:
        request_id = int(message["id"])
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            self._send({"op": "spawn_failed", "id": request_id, "error": "spawn request without its two fds"})
            return
        out_fd, control_fd = fds
        argv = [str(a) for a in message["argv"]]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = -1
        if (why := self._census.unfit()) is not None:
            # A thread started since startup: this helper must not fork again (the loop stops using it).
            self._send({"op": "spawn_failed", "id": request_id, "error": why, "unfit": True})
        else:
            try:
                pid = fork_sibling()
            except OSError as exc:
                self._send({"op": "spawn_failed", "id": request_id, "error": f"fork failed: {exc.strerror}"})
        if pid == 0:
            _become_child(out_fd, control_fd, argv, self._target, self._parent_pid)
        # The child holds its own copies; once ours are closed, the loop's end of the control socket
        # sees EOF as soon as no child holds it either.
        os.close(out_fd)
        os.close(control_fd)

    def _send(self, message: dict[str, Any]) -> None:
        self._outbox.append(encode(message))
        self._flush()

    def _flush(self) -> bool:
        while self._outbox:
            try:
                self._sock.send(self._outbox[0])
            except BlockingIOError:
                return True
            except OSError:
                return False
            self._outbox.popleft()
        return True


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_local_executor.core.launchers.forkserver_helper")
    parser.add_argument("--fd", type=int, required=True, help="the SOCK_SEQPACKET channel")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--target", required=True, help="module:function run in each child")
    parser.add_argument("--preload", action="append", default=[], help="module to import before forking")
    parser.add_argument(
        "--learned", action="store_true", help="the first message on the channel lists learned modules to try"
    )
    args = parser.parse_args(argv)
    # Its own process group, so a terminal's Ctrl-C reaches the scheduler alone (which shuts us down
    # in order), but the scheduler's session: Linux shares CPU fairly between sessions (autogroups),
    # and the workloads must compete for CPU as the scheduler's work, as stock's workers do, not as
    # a second session that gets as much CPU as the scheduler, the api-server and every other one.
    with contextlib.suppress(PermissionError):  # already a group leader
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent(args.parent_pid):
        return EXIT_ORPHANED
    if (why := sibling_fork_supported()) is not None:
        print(f"fork server: cannot fork workloads here: {why}", file=sys.stderr, flush=True)
        return 1
    sock = socket.socket(fileno=args.fd)
    size_buffers(sock)
    census = ThreadCensus()
    with census.watching(args.target.partition(":")[0]):
        target = resolve(args.target)
    # The module the target string names (not the function's ``__module__``: the workload entries are
    # methods of a shared skeleton) may name its heavy imports, then shared copy-on-write by every child.
    owner_name = args.target.partition(":")[0]
    if callable(preload := getattr(sys.modules[owner_name], "preload", None)):
        with census.watching(f"{owner_name}.preload()"):
            preload()
    for module in args.preload:
        try:
            with census.watching(module):
                importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a bad preload entry costs speed, not correctness
            print(
                f"fork server: cannot preload {module!r}, skipping it: {exc!r}", file=sys.stderr, flush=True
            )
    if census.unfit() is not None:
        stop_known_pools()  # a preloaded NumPy's OpenBLAS workers restart in each task that needs them
    census.settle(THREAD_SETTLE)
    if (why := census.unfit()) is not None:
        # Said on the channel, in place of "ready": the loop stops asking for a helper and launches
        # every workload without one, instead of starting helper after helper that would refuse too.
        sock.send(encode({"op": "unfit", "error": why}))
        return 1
    learned = None
    if args.learned:
        try:
            learned = _preload_learned(sock, census)
        except Unfit as exc:
            sock.send(
                encode({"op": "unfit", "error": exc.reason, "blame": exc.module, "preload": exc.report})
            )
            return 1
    # Moved to a permanent generation, the imported objects are never touched by a child's GC, so
    # their pages stay shared. (The learning froze objects along the way: each is collected first.)
    ImportWatch.release()
    gc.collect()
    gc.freeze()
    return Helper(sock, target, args.parent_pid, census, learned).serve()


def _preload_learned(sock: socket.socket, census: ThreadCensus) -> dict[str, Any]:
    """Import the learned modules the loop sends (after the target's and the explicit ones)."""
    plan = decode(sock.recv(MAX_MESSAGE))
    modules = [str(m) for m in plan.get("modules") or ()]

    def progress(module: str) -> None:
        sys.stdout.flush()
        sock.send(encode({"op": "importing", "module": module}))

    return preload_learned(
        modules, budget=int(plan.get("budget") or 0), census=census, settle=THREAD_SETTLE, progress=progress
    )


if __name__ == "__main__":
    sys.exit(main())
