"""The Airflow processes of a sandbox: starting them, signalling them, finding and killing what they left.

Each long-running process (api-server, scheduler, dag-processor, any extra one) gets a process group
of its own and a log file with its stdout and stderr. Task processes move to process groups of their
own, so a process group is not enough to find everything a sandbox started: every child also carries
the sandbox's marker variable, and :func:`live_pids` looks for it in ``/proc``.

A process may be started with a descriptor limit of its own (``nofile``: a scheduler whose
``RLIMIT_NOFILE`` is lower than the test's, as a systemd unit's ``LimitNOFILE=`` or a container's
``--ulimit nofile=`` sets it). It is run under ``prlimit --nofile=SOFT:HARD --``, which sets the limit
on itself and then execs the command: the limit is there before the first line of Airflow runs, only
that process (and what it starts) has it, and its pid is the one the sandbox knows it by. Not a
``preexec_fn``, which is unsafe in a process with threads (the tests' and benchmarks' probes), nor a
``prlimit(pid)`` after the start, which would race with the scheduler reading its limit at start.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from harness.environment import SANDBOX_MARKER_ENV
from harness.waits import SandboxError

__all__ = ["FINISHED", "Processes", "live_pids", "tail"]

# What a process writes to its log once it has done all it does before its interpreter exits, after a
# SIGTERM. The api-server's (uvicorn's last line, after the application's shutdown) is followed by one to
# two seconds of CPU spent collecting its garbage at exit, which nobody waits for: the stop kills it then.
FINISHED: Final[Mapping[str, str]] = {"api-server": "Finished server process [{pid}]"}


class Processes:
    """Starts and stops the Airflow processes of one sandbox.

    :param env: the environment of every process started; kept by reference, so a change to it
        applies to the processes started after the change (that is how the sandbox reconfigures).
    :param logs: log file per process name; a name not in it cannot be started.
    :param commands: ``airflow`` CLI arguments per process name, for names that are not the command.
    :param stop_timeout: how long :meth:`terminate_all` waits for each process after SIGTERM.
    :param nofile: ``RLIMIT_NOFILE`` (soft, hard) per process name, for the processes that must not have
        this process's (the module's docstring says how it is set); each start of that name gets it.
    """

    def __init__(
        self,
        *,
        env: dict[str, str],
        home: Path,
        python: Path,
        logs: Mapping[str, Path],
        commands: Mapping[str, Sequence[str]],
        marker: str,
        stop_timeout: float,
        say: Callable[[str], None],
        nofile: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.env = env
        self.home = home
        self.python = python
        self.logs = dict(logs)
        self.commands = dict(commands)
        self.marker = marker
        self.stop_timeout = stop_timeout
        self._say = say
        self.nofile = dict(nofile or {})
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_handles: list[IO[bytes]] = []
        self._pgids: set[int] = set()

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs.items()}

    @property
    def started(self) -> bool:
        """Whether :meth:`terminate_all` has processes to stop."""
        return bool(self._procs)

    def argv(self, args: Sequence[str]) -> list[str]:
        """The command line of ``airflow <args>`` in the sandbox's virtualenv."""
        script = self.python.parent / "airflow"
        if script.exists():
            return [str(script), *args]
        return [str(self.python), "-m", "airflow", *args]

    def limited(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as process ``name`` runs it: under ``prlimit`` when it has a descriptor limit of its own."""
        if name not in self.nofile:
            return argv
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxError(f"{name} needs its own RLIMIT_NOFILE, and there is no prlimit (util-linux)")
        soft, hard = (_limit(value) for value in self.nofile[name])
        return [prlimit, f"--nofile={soft}:{hard}", "--", *argv]

    def migrate(self, timeout: float) -> None:
        """``airflow db migrate``, its output in the ``db-migrate`` log."""
        log_path = self.logs["db-migrate"]
        with log_path.open("wb") as out:
            try:
                result = subprocess.run(
                    self.argv(["db", "migrate"]),
                    env=self.env,
                    cwd=self.home,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    start_new_session=True,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise SandboxError(f"airflow db migrate timed out; log tail:\n{tail(log_path)}") from exc
        if result.returncode != 0:
            raise SandboxError(
                f"airflow db migrate failed with exit code {result.returncode}; log tail:\n{tail(log_path)}"
            )

    def run_cli(self, args: Sequence[str], timeout: float, check: bool) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command with the sandbox environment and capture its output."""
        result = subprocess.run(
            self.argv(args),
            env=self.env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise SandboxError(
                f"airflow {' '.join(args)} failed with exit code {result.returncode}:\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def add(self, name: str, args: Sequence[str], log: Path) -> None:
        """One more long-running process this sandbox may :meth:`spawn` (a second scheduler), its output
        in ``log``; it is signalled, restarted and stopped by ``name`` like the others."""
        if name in self.logs:
            raise SandboxError(f"the sandbox has a process named {name} already")
        self.logs[name] = log
        self.commands[name] = tuple(args)

    def spawn(self, name: str) -> None:
        log_path = self.logs[name]
        handle = log_path.open("ab")
        self._log_handles.append(handle)
        proc = subprocess.Popen(
            self.limited(name, self.argv(self.commands.get(name, (name,)))),
            env=self.env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            # Own process group: stop() can signal the process and all its workers at once.
            start_new_session=True,
        )
        self._procs[name] = proc
        self._pgids.add(proc.pid)

    def kill(self, name: str) -> int:
        """SIGKILL one process (not its group) and reap it; return the pid it had."""
        proc = self._procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(self.stop_timeout)
        return proc.pid

    def signal_and_wait(self, name: str, sig: signal.Signals, timeout: float) -> int:
        """Send ``sig`` to one process (not its group) and return its exit status.

        :raises SandboxError: if it is still running after ``timeout`` seconds
        """
        proc = self._procs[name]
        os.kill(proc.pid, sig)
        if not _wait_exit(proc, timeout):
            raise SandboxError(f"{name} still running {timeout:.0f}s after {sig.name}")
        return int(proc.returncode)

    def send_signal(self, name: str, sig: signal.Signals) -> int:
        """Send ``sig`` to one process (not its group) without waiting; return its pid."""
        proc = self._procs[name]
        os.kill(proc.pid, sig)
        return proc.pid

    def wait_exited(self, name: str, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for one process to exit: its exit status, or None if it still runs."""
        proc = self._procs[name]
        return int(proc.returncode) if _wait_exit(proc, timeout) else None

    def restart(self, name: str) -> None:
        """Start a process of this kind again (after :meth:`kill`)."""
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            raise SandboxError(f"{name} is still running (pid {proc.pid})")
        self.spawn(name)

    def live_pids(self) -> list[int]:
        """Every live process this sandbox started, directly or not (task processes included)."""
        return live_pids(self.marker, self._pgids)

    def log_tail(self, name: str, lines: int = 60) -> str:
        return tail(self.logs[name], lines)

    def check(self) -> None:
        """Raise if one of the long-running processes has exited."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                raise SandboxError(f"{name} exited with code {code}; log tail:\n{self.log_tail(name)}")

    def terminate_all(self) -> None:
        """SIGTERM the process groups stage by stage, SIGABRT then SIGKILL what ignores it; reap them all."""
        # Scheduler first: its executor waits for running tasks on shutdown, and those still need the
        # api-server to report their final state. Stopping everything at once made tasks retry against a
        # dead api-server until the scheduler was SIGKILLed. The dag-processor needs neither, so it stops
        # beside the scheduler. Extra processes (a Celery worker) go before the api-server, one at a time,
        # for the same reason as the scheduler.
        first: list[str] = [name for name in ("scheduler", "dag-processor") if name in self._procs]
        stages: list[list[str]] = [first] if first else []
        stages += [[name] for name in self._procs if name not in ("scheduler", "dag-processor", "api-server")]
        stages += [["api-server"]] if "api-server" in self._procs else []
        took: list[str] = []
        for stage in stages:
            began = time.monotonic()
            finished = {name: self._finished(name) for name in stage}
            for name in stage:
                if self._procs[name].poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self._procs[name].pid, signal.SIGTERM)
            # Each stage its own bound: a slow scheduler must not eat the api-server's time to stop.
            deadline = began + self.stop_timeout
            for name in stage:
                proc = self._procs[name]
                if not _wait_exit(proc, deadline - time.monotonic(), finished[name]):
                    self._say(
                        f"{name} ignored SIGTERM for {self.stop_timeout:.0f}s; sending SIGABRT (its threads' "
                        f"stacks go to {self.logs[name]}), then SIGKILL"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGABRT)
                    _wait_exit(proc, 5.0)
                took.append(f"{name} {time.monotonic() - began:.1f}s")
        began = time.monotonic()
        for proc in self._procs.values():
            # Also reaps group members (executor workers, uvicorn) that outlived their leader.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait_exit(proc, 5.0)
        self._say(f"stopped {', '.join(took)}; their groups killed in {time.monotonic() - began:.1f}s")
        self._procs.clear()

    def _finished(self, name: str) -> Callable[[], bool] | None:
        """Whether process ``name`` has written its :data:`FINISHED` line since now (None: it has none)."""
        if name not in FINISHED:
            return None
        log = self.logs[name]
        line = FINISHED[name].format(pid=self._procs[name].pid).encode()
        offset = log.stat().st_size if log.exists() else 0

        def said() -> bool:
            with contextlib.suppress(FileNotFoundError), log.open("rb") as file:
                file.seek(offset)
                return line in file.read()
            return False

        return said

    def kill_leftovers(self) -> None:
        """SIGKILL every live process still carrying the marker or in one of our process groups."""
        # Task processes run in process groups of their own, so killpg on our groups misses
        # them; the marker env var finds them. A SIGKILLed process also needs a moment to go.
        deadline = time.monotonic() + 10.0
        killed: set[int] = set()
        while pids := live_pids(self.marker, self._pgids):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(pids)
            if time.monotonic() >= deadline:
                self._say(f"processes still alive after SIGKILL: {pids}")
                break
            time.sleep(0.1)
        if killed:
            self._say(f"killed {len(killed)} leftover process(es): {sorted(killed)}")

    def close_logs(self) -> None:
        for handle in self._log_handles:
            handle.close()
        self._log_handles.clear()


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"<{path} does not exist>"
    return "\n".join(text.splitlines()[-lines:])


def live_pids(marker: str, pgids: Iterable[int]) -> list[int]:
    """Live (non-zombie) pids in one of ``pgids`` or carrying our marker env (Linux /proc only)."""
    needle = f"{SANDBOX_MARKER_ENV}={marker}".encode()
    groups = set(pgids)
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    own = os.getpid()
    found: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue  # a zombie holds no resources; its (re)parent reaps it
            if int(fields[2]) in groups or needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone already, or not ours to read
    return found


def _limit(value: int) -> str:
    """A resource limit as ``prlimit`` takes it (``resource.RLIM_INFINITY`` is ``unlimited``)."""
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _wait_exit(
    proc: subprocess.Popen[bytes], timeout: float, finished: Callable[[], bool] | None = None
) -> bool:
    """Wait up to ``timeout`` seconds for ``proc`` to exit; once ``finished()`` says it has done all it does,
    SIGKILL it instead of waiting for its interpreter's exit. Whether it exited."""
    if finished is None:
        try:
            proc.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + max(0.1, timeout)
    while True:
        try:
            proc.wait(timeout=0.05)
            return True
        except subprocess.TimeoutExpired:
            pass
        if finished():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            return _wait_exit(proc, 5.0)
        if time.monotonic() >= deadline:
            return False
