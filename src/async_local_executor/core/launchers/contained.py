"""Each workload in a cgroup of its own: a launcher that wraps either launch path.

The workload's process joins its cgroup before it gets its payload (see ``LaunchRequest.before_start``),
so everything the task starts is born inside and stays there whatever it does (``setsid``, ``env -i``,
a double fork, another uid). Stopping a workload signals the whole cgroup; when its main process has
exited, what it left behind is killed (unless ``kill_leftovers`` is off) and the cgroup removed, and what
the cgroup used and whether the kernel OOM-killed anything in it goes into the outcome. A workload
released alive keeps its cgroup, untouched: it belongs to whoever adopts the workload (its path is
``child.cgroup.path``), and this wrapper re-attaches it for an adopter (a request's ``takeover``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import signal
from pathlib import Path

import anyio
import anyio.to_thread

from async_local_executor.core.cgroups import (
    Containment,
    Limits,
    LimitUnavailable,
    WorkloadCgroup,
    names,
)
from async_local_executor.core.cgroups.containment import recorded_cgroup
from async_local_executor.core.errors import LaunchError, is_full, launch_error
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, Wrapper
from async_local_executor.core.outcome import Cleanup

log = logging.getLogger(__name__)

# Seconds the leftovers of an ended workload get to leave its cgroup after SIGKILL before it is left
# for the executor's own removal at shutdown (or a successor's reclaim). Real seconds: a worker thread
# waits them out in a blocking poll of the cgroup, where no event-loop clock reaches.
SETTLE_GUARD = 5.0


class ContainedLauncher(Wrapper):
    """Launches through ``inner``, each workload in a new cgroup of ``containment``.

    :param inner: the launch path that starts the process
    :param containment: the executor instance's cgroups; in mode NONE every launch goes to ``inner`` as is
    :param limits: every workload's limits; a request's own override them one by one
    :param kill_leftovers: kill what a workload left in its cgroup once its main process has exited
    """

    def __init__(
        self,
        inner: Launcher,
        containment: Containment,
        *,
        limits: Limits = Limits(),  # noqa: B008 - frozen
        kill_leftovers: bool = True,
    ) -> None:
        super().__init__(inner)
        self._containment = containment
        self._limits = limits
        self._kill_leftovers = kill_leftovers
        self._names = itertools.count(1)

    async def launch(self, request: LaunchRequest) -> Child:
        if request.takeover is not None:
            return await self._take_over(request)
        limits = self._limits.merged(request.limits)
        name = names.workload(next(self._names))
        try:
            # On the loop: cgroupfs writes are in-kernel and cost less than a worker thread's round trip
            # (docs/design.md, Containment); _settle, which may wait for a cgroup to empty, stays in a
            # worker thread.
            cgroup = self._containment.create(name, limits, low_cpu=request.low_cpu)
        except LimitUnavailable as exc:
            raise LaunchError(f"cannot apply its limits ({limits.describe()}): {exc}") from exc
        except OSError as exc:
            if is_full(exc):  # a capacity reached: it waits for descriptors rather than run uncontained
                raise launch_error("cannot create its cgroup", exc) from exc
            why = f"cannot create its cgroup: {exc.strerror or exc}"
            if not limits.empty:
                raise LaunchError(f"{why}, and it has limits ({limits.describe()})") from exc
            # One task run uncontained hurts less than one task not run at all.
            log.warning("workload %s runs without a cgroup of its own: %s", request.label or request.key, why)
            return await self._inner.launch(request)
        if cgroup is None:
            if not limits.empty:  # never silently ignored
                raise LaunchError(
                    f"cannot apply its limits ({limits.describe()}): no cgroups here "
                    f"({self._containment.describe()})"
                )
            return await self._inner.launch(request)
        earlier = request.before_start

        async def join(pid: int) -> None:
            # One that already exited (a zombie cannot join) started nothing; its status tells why.
            with contextlib.suppress(ProcessLookupError):
                cgroup.join(pid)
            if earlier is not None:
                await earlier(pid)

        try:
            child = await self._inner.launch(dataclasses.replace(request, before_start=join))
        except BaseException:
            cgroup.remove()
            raise
        return ContainedChild(child, cgroup, kill_leftovers=self._kill_leftovers)

    async def _take_over(self, request: LaunchRequest) -> Child:
        """A process another executor launched, in the cgroup that executor made for it (if it made one):
        from now on signalled, settled and removed like one of ours. Its process runs and is ours from
        the take on: whatever fails here, it is supervised, if need be without its cgroup."""
        child = await self._inner.launch(request)
        if request.takeover is None or request.takeover.cgroup_dir is None:
            return child
        recorded = Path(request.takeover.cgroup_dir)
        try:
            with anyio.CancelScope(shield=True):
                cgroup = await anyio.to_thread.run_sync(recorded_cgroup, recorded, child.pid)
        except Exception:
            log.exception("cannot re-attach the cgroup of adopted workload process %d", child.pid)
            return child
        if cgroup is None:  # removed meanwhile: its process groups are what signals reach
            return child
        return ContainedChild(child, cgroup, kill_leftovers=self._kill_leftovers)


class ContainedChild:
    """A launched workload in its cgroup; the same contract as the child it wraps, with its cgroup and,
    once :meth:`wait` has returned, its cleanup."""

    def __init__(self, child: Child, cgroup: WorkloadCgroup, *, kill_leftovers: bool) -> None:
        self._child = child
        # One we did not fork learns from our signal how it ended, when it could not record its exit.
        self._child_signalled_too = isinstance(child, AdoptedChild)
        self._cgroup = cgroup
        self._kill_leftovers = kill_leftovers
        self._killed = False
        self._released = False
        self._cleanup: Cleanup | None = None

    @property
    def cgroup(self) -> WorkloadCgroup:
        return self._cgroup

    @property
    def releasable(self) -> bool:
        return self._child.releasable

    @property
    def cleanup(self) -> Cleanup | None:
        return self._cleanup

    @property
    def pid(self) -> int:
        return self._child.pid

    def signal(self, sig: int) -> None:
        if self._released:
            return  # handed over: its cgroup and what is in it are its adopter's now
        # The whole cgroup, whatever session or group its members put themselves in. cgroupfs files are
        # kernel memory: reading cgroup.procs does not block the loop the way disk I/O would.
        try:
            if sig == signal.SIGKILL:
                self._killed = True
                if self.cgroup.kills_at_once:
                    self.cgroup.kill()
                else:
                    # Before cgroup.kill, a kill nothing escapes freezes the cgroup first and waits for
                    # it (members in D state take long): that is _settle's, in a worker thread, once the
                    # main process is gone. Every member gets SIGKILL now.
                    self.cgroup.signal(sig)
            else:
                self.cgroup.signal(sig)
        except OSError:
            self._child.signal(sig)  # the cgroup refused: its process group still gets it
            return
        if self._child_signalled_too:
            self._child.signal(sig)

    def release(self) -> None:
        if not self._child.releasable:
            return  # it stays supervised, and its cgroup settled as ever
        self._released = True
        self._child.release()

    async def wait(self) -> int:
        try:
            return await self._child.wait()
        finally:
            # Released: nothing in its cgroup is killed, and the cgroup stays, with the workload in it.
            if not self._released:
                # Shielded: a cancelled wait must still not leave the workload's processes behind.
                with anyio.CancelScope(shield=True):
                    self._cleanup = await anyio.to_thread.run_sync(self._settle)

    def _settle(self) -> Cleanup:
        """Worker thread: read what the cgroup used, kill what is left in it, remove it."""
        cgroup = self.cgroup
        try:
            oom_kills = cgroup.oom_kills()
            usage = cgroup.usage()
            leftovers = len(cgroup.members())
            killed = 0
            if leftovers and (self._kill_leftovers or self._killed):
                killed = cgroup.kill()
                if not cgroup.wait_empty(SETTLE_GUARD):
                    log.warning("processes of cgroup %s are still there after SIGKILL", cgroup.path)
            if not cgroup.populated():
                cgroup.remove()
        except OSError as exc:
            log.warning("cannot settle cgroup %s: %s", cgroup.path, exc)
            return Cleanup(memory_limit=cgroup.limits.memory)
        return Cleanup(
            leftovers=leftovers,
            killed=killed,
            oom_kills=oom_kills,
            memory_peak=usage.memory_peak,
            cpu_seconds=usage.cpu_seconds,
            memory_limit=cgroup.limits.memory,
        )
