"""The helper process: ``python -m async_local_executor.core.launchers.forkserver.helper``.

Its start, in order: leave the terminal's process group but stay in the scheduler's session, die with
the scheduler, import the target's module (and its ``preload()``) and the explicit preloads, check that
no thread runs, import the learned modules of the loop's plan one by one (:mod:`.preload`), freeze
what was imported so every child shares its pages, then serve (:mod:`.server`). A helper that must not
fork says ``unfit`` in place of ``ready`` and exits.

Only the standard library is imported: this runs in a process that must start fast, and a target's
heavy imports happen once, here, before the first fork.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import socket
import sys
from collections.abc import Sequence

from async_local_executor.core.launchers.forkserver import protocol
from async_local_executor.core.launchers.forkserver.helper.clone import sibling_fork_supported
from async_local_executor.core.launchers.forkserver.helper.hygiene import ImportWatch
from async_local_executor.core.launchers.forkserver.helper.preload import Unfit, preload_learned
from async_local_executor.core.launchers.forkserver.helper.server import Helper, Target
from async_local_executor.core.launchers.forkserver.helper.threads import ThreadCensus, stop_known_pools
from async_local_executor.core.launchers.forkserver.protocol import MAX_MESSAGE, decode, encode, size_buffers
from async_local_executor.core.lifeline import EXIT_ORPHANED, die_with_parent

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_local_executor.core.launchers.forkserver.helper")
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
        sock.send(encode(protocol.Unfit(error=why)))
        return 1
    learned = None
    base = frozenset(sys.modules)  # what a check counts as had: not what learned modules bring in
    if args.learned:
        try:
            learned = _preload_learned(sock, census)
        except Unfit as exc:
            sock.send(encode(protocol.Unfit(error=exc.reason, blame=exc.module, preload=exc.report)))
            return 1
    # Moved to a permanent generation, the imported objects are never touched by a child's GC, so
    # their pages stay shared. (The learning froze objects along the way: each is collected first.)
    ImportWatch.release()
    gc.collect()
    gc.freeze()
    return Helper(sock, target, args.parent_pid, census, learned, base).serve()


def _preload_learned(sock: socket.socket, census: ThreadCensus) -> protocol.PreloadReport:
    """Import the learned modules the loop sends (after the target's and the explicit ones)."""
    plan = decode(sock.recv(MAX_MESSAGE))
    if not isinstance(plan, protocol.Plan):
        raise protocol.ProtocolError(f"expected a plan first, got {plan.op}")

    def progress(module: str) -> None:
        sys.stdout.flush()
        sock.send(encode(protocol.Importing(module=module)))

    return preload_learned(
        list(plan.modules), budget=plan.budget, census=census, settle=THREAD_SETTLE, progress=progress
    )


if __name__ == "__main__":
    sys.exit(main())
