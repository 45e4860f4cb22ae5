"""An executor instance's cgroup tree: where workload cgroups are made, limited and, after a crash, reclaimed.

Each instance gets ``ale-<instance>`` under its parent (the process's own cgroup2 cgroup, or a configured
root) and one directory per workload below it. Limits come from cgroup2 where the controller is
delegated there; on a hybrid host, where cgroup2 has no controllers, from the cgroup v1 hierarchies, in
a directory of the same name beside the process's own v1 cgroup. Without a usable cgroup2 mount the
executor runs uncontained (:attr:`Mode.NONE`) and says why.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from async_local_executor.core.cgroups import names
from async_local_executor.core.cgroups.discovery import (
    MOUNTINFO,
    PROC_CGROUP,
    cgroup2_entry,
    cgroup_mounts,
    cgroup_path,
    directory_of,
    enable_controllers,
    make_root,
    mount_root,
    own_cgroups,
    v1_mounts,
)
from async_local_executor.core.cgroups.group import (
    WorkloadCgroup,
    remove_directory,
    remove_tree,
    subdirectories,
)
from async_local_executor.core.cgroups.limits import Limits, limit_writes

log = logging.getLogger(__name__)

LIMITED = ("memory", "cpu", "pids")
# How long a dead instance's killed workloads get to leave their cgroup before it is left for later.
RECLAIM_GUARD = 5.0
_HINT = "delegate the scheduler's cgroup, for example systemd Delegate=yes, or set cgroup_root"
# Controllers need a delegated cgroup that holds no process: the scheduler's own cannot enable them.
_CONTROLLER_HINT = (
    "systemd Delegate=yes with DelegateSubgroup=main and cgroup_root set to the service's cgroup"
)


class Mode(enum.Enum):
    """Whether workloads get cgroups."""

    CGROUP2 = "cgroup2"
    NONE = "none"


class ContainmentError(Exception):
    """A configured cgroup_root that cannot be used (the message says the path and why)."""


class LimitUnavailable(Exception):
    """A limit whose controller is not available (the message names the limit, the controller, how to get it)."""


@dataclass(frozen=True)
class Reclaimed:
    """A workload cgroup of a dead instance whose processes were killed."""

    instance: str
    workload: str
    killed: int


def _try_mkdir(directory: Path) -> bool:
    try:
        directory.mkdir(exist_ok=True)
    except OSError as exc:
        log.debug("cannot create cgroup %s: %s", directory, exc)
        return False
    return True


class Containment:
    """The cgroups of one executor instance (see the module docstring); blocking, for a worker thread."""

    def __init__(
        self,
        instance: str,
        mode: Mode,
        why: str,
        path: Path | None = None,
        *,
        handed_over: Callable[[int], bool] = lambda _pid: False,
    ) -> None:
        self.instance = instance
        self.mode = mode
        self.why = why
        """NONE: why there are no cgroups; CGROUP2: where they are."""
        self.path = path
        """The instance's cgroup2 directory."""
        self.controllers: Mapping[str, str] = {}
        """``memory``/``cpu``/``pids`` -> ``cgroup2`` or ``cgroup v1``; only those usable for limits."""
        self._mount = Path("/")
        self._mount_root = "/"
        self._parent: Path | None = None
        self._v1: dict[str, Path] = {}  # controller -> this instance's v1 directory
        self._v1_parents: dict[str, Path] = {}  # controller -> where v1 instance directories are made
        self._handed_over = handed_over

    @classmethod
    def open(
        cls,
        instance: str,
        *,
        root: str | None = None,
        mountinfo: str = MOUNTINFO,
        proc_cgroup: str = PROC_CGROUP,
        handed_over: Callable[[int], bool] = lambda _pid: False,
    ) -> Containment:
        """This instance's cgroup directories, made (and their controllers enabled) if they can be.

        :param instance: the instance's name (letters, digits, ``._-``)
        :param root: a cgroup2 path to make the instance under, created if missing; else the own cgroup
        :param mountinfo: where the mounts are listed
        :param proc_cgroup: where this process's cgroups are listed
        :param handed_over: whether process ``pid`` is a workload this instance handed over to a successor:
            :meth:`close` leaves its cgroup (and the instance's directories) to its adopter
        :returns: the containment; :attr:`Mode.NONE` with :attr:`why` when cgroups cannot be had
        :raises ValueError: when ``instance`` is not a valid name
        :raises ContainmentError: when ``root`` was given and cannot be used
        """
        names.check("instance", instance)
        mount = cgroup2_entry(mountinfo)
        if mount is None:
            if root:
                raise ContainmentError(f"cgroup_root {root}: no cgroup2 mount in {mountinfo}")
            return cls(instance, Mode.NONE, f"no cgroup2 mount in {mountinfo}", handed_over=handed_over)
        own = own_cgroups(proc_cgroup)
        chain: list[Path] = []
        if root:
            try:
                parent, chain = make_root(mount.point, root)
            except (ValueError, OSError) as exc:
                detail = exc.strerror if isinstance(exc, OSError) else None
                raise ContainmentError(f"cgroup_root {root}: {detail or exc}") from exc
        elif "" in own:
            parent = directory_of(mount.point, mount.root, own[""])
        else:
            return cls(instance, Mode.NONE, f"no cgroup2 line in {proc_cgroup}", handed_over=handed_over)
        directory = parent / names.instance_dir(instance)
        try:
            directory.mkdir(exist_ok=True)
        except OSError as exc:
            why = f"cannot create {directory}: {exc.strerror or exc}"
            if root:
                raise ContainmentError(f"cgroup_root {root}: {why}") from exc
            return cls(instance, Mode.NONE, f"{why} ({_HINT})", handed_over=handed_over)
        made = cls(instance, Mode.CGROUP2, str(directory), directory, handed_over=handed_over)
        made._mount, made._mount_root, made._parent = mount.point, mount.root, parent
        for each in [*(chain or [parent]), directory]:
            enable_controllers(each, LIMITED)
        try:
            text = (directory / "cgroup.subtree_control").read_text()
        except OSError:
            text = ""
        controllers = {name: "cgroup2" for name in text.split() if name in LIMITED}
        v1 = v1_mounts(mountinfo)
        for name in LIMITED:
            if name not in v1 or name not in own:
                continue
            v1_parent = directory_of(v1[name], mount_root(v1[name], mountinfo), own[name])
            made._v1_parents[name] = v1_parent
            if name not in controllers and _try_mkdir(v1_parent / names.instance_dir(instance)):
                controllers[name] = "cgroup v1"
                made._v1[name] = v1_parent / names.instance_dir(instance)
        made.controllers = dict(sorted(controllers.items(), key=lambda item: LIMITED.index(item[0])))
        return made

    def describe(self) -> str:
        """One line for the log: where the cgroups are and which limits they can enforce, or why none.

        :returns: the line
        """
        if self.mode is Mode.NONE:
            return f"none: {self.why}"
        limits = ", ".join(f"{name} via {where}" for name, where in self.controllers.items())
        return f"cgroup2 at {self.path} (limits: {limits or 'none available'})"

    def missing(self, limits: Limits) -> list[str]:
        """The controllers ``limits`` need that this instance cannot use (all of them in mode NONE)."""
        wanted = {"memory": limits.memory, "cpu": limits.cpu, "pids": limits.pids}
        return [name for name, value in wanted.items() if value is not None and name not in self.controllers]

    @property
    def weighs_cpu(self) -> bool:
        """Whether a workload's CPU weight can be set (:meth:`WorkloadCgroup.lower_cpu`)."""
        return "cpu" in self.controllers

    def create(
        self,
        name: str,
        limits: Limits = Limits(),  # noqa: B008 - frozen
        *,
        low_cpu: bool = False,
    ) -> WorkloadCgroup | None:
        """A new workload cgroup with ``limits`` written, before any process is in it.

        :param name: the workload cgroup's name (letters, digits, ``._-``), unique in this instance
        :param limits: what the workload may use
        :param low_cpu: start it with the lowest CPU weight (where :attr:`weighs_cpu`), for
            :meth:`WorkloadCgroup.restore_cpu` to undo
        :returns: the cgroup; None when :attr:`mode` is NONE
        :raises ValueError: when ``name`` is not a valid name
        :raises LimitUnavailable: when a limit's controller is not available (nothing is made)
        :raises OSError: when a directory or a limit cannot be written (what was made is removed)
        """
        if self.mode is Mode.NONE or self.path is None:
            return None
        names.check("workload", name)
        if missing := self.missing(limits):
            controller = missing[0]
            raise LimitUnavailable(
                f"{controller} limit needs the {controller} controller, which {self.path} does not have: "
                f"enable it for cgroup2 ({_CONTROLLER_HINT}) or mount the cgroup v1 {controller} hierarchy"
            )
        wanted = {"memory": limits.memory, "cpu": limits.cpu, "pids": limits.pids}
        # v1 memory always when it is the only memory accounting; cpu and pids only to limit (or weigh).
        low_cpu = low_cpu and self.weighs_cpu
        v1 = {
            controller: parent / name
            for controller, parent in self._v1.items()
            if controller == "memory" or wanted[controller] is not None or (controller == "cpu" and low_cpu)
        }
        made: list[Path] = []
        try:
            for directory in dict.fromkeys([self.path / name, *v1.values()]):
                directory.mkdir()
                made.append(directory)
            self._write(self.path / name, v1, limits)
            relative = cgroup_path(self._mount, self._mount_root, self.path / name)
            cgroup = WorkloadCgroup(
                name, self.path / name, v1, limits, relative, cpu_home=self._v1_parents.get("cpu")
            )
            if low_cpu:
                cgroup.lower_cpu()
        except OSError:
            for directory in reversed(made):
                remove_directory(directory)
            raise
        return cgroup

    def _write(self, directory: Path, v1: Mapping[str, Path], limits: Limits) -> None:
        for write in limit_writes(limits, self.controllers):
            target = (v1[write.hierarchy] if write.hierarchy else directory) / write.file
            if write.required or target.exists():
                target.write_text(write.value)

    def reclaim(
        self,
        is_live: Callable[[str], bool],
        *,
        spare: Collection[str] = frozenset(),
        answered_for: Callable[[str, int], bool] = lambda _instance, _pid: False,
    ) -> list[Reclaimed]:
        """Kill and remove what dead instances under the same parents left; this instance is never touched.

        :param is_live: whether the instance of that name still runs (then its cgroups are left alone)
        :param spare: workload cgroups of dead instances to leave as they are, processes and all (a
            workload handed over to this instance): each a cgroup2 directory, or its path as
            ``/proc/<pid>/cgroup`` shows it; one below a workload cgroup spares that one. Their instance's
            directories stay too
        :param answered_for: whether a process in a cgroup of the dead instance of that name is somebody
            else's to end (a workload another executor may adopt, whose own watchdog ends it otherwise):
            a workload cgroup holding one is spared too
        :returns: one entry per workload cgroup that had processes
        """
        if self.mode is Mode.NONE or self._parent is None:
            return []
        found: list[Reclaimed] = []
        parents = [self._parent, *dict.fromkeys(self._v1_parents.values())]
        verdicts: dict[str, bool] = {}
        spared: dict[str, set[str]] = {}  # instance -> names of its workload cgroups spared (cgroup2 first)
        for parent in parents:
            for directory in subdirectories(parent):
                instance = names.instance_of(directory.name)
                if instance is None:
                    continue
                if instance == self.instance:
                    continue
                if instance not in verdicts:
                    verdicts[instance] = _live(is_live, instance)
                if verdicts[instance]:
                    continue
                kept = spared.setdefault(instance, set())
                try:
                    found.extend(
                        self._reclaim(
                            instance, directory, kept, spare, answered_for, v2=parent == self._parent
                        )
                    )
                except OSError as exc:
                    log.warning("cannot reclaim cgroup %s: %s", directory, exc)
        return found

    def _reclaim(
        self,
        instance: str,
        top: Path,
        kept: set[str],
        spare: Collection[str],
        answered_for: Callable[[str, int], bool],
        *,
        v2: bool,
    ) -> list[Reclaimed]:
        found: list[Reclaimed] = []
        for directory in subdirectories(top) if v2 else []:
            relative = cgroup_path(self._mount, self._mount_root, directory)
            if _spared(spare, str(directory), relative):
                # Left alone on purpose: the executor says what it holds (and, later, what it adopts).
                log.debug(
                    "cgroup %s of a stopped executor is left as it is: its workload was handed over",
                    directory,
                )
                kept.add(directory.name)
                continue
            # Only its cgroup2 side is killed: a process in the v1 directories is in these too.
            cgroup = WorkloadCgroup(directory.name, directory, {}, Limits(), relative)
            try:
                if waiting := [pid for pid in cgroup.members() if answered_for(instance, pid)]:
                    # Another deployment's to adopt or end: nothing this executor does, nothing to act on.
                    log.debug(
                        "cgroup %s of a stopped executor is left as it is: its workload (pid %s) waits "
                        "to be adopted, and ends itself if it is not",
                        directory,
                        ", ".join(map(str, waiting)),
                    )
                    kept.add(directory.name)
                    continue
                if cgroup.populated():
                    killed = cgroup.kill()
                    if not cgroup.wait_empty(RECLAIM_GUARD):
                        log.warning("processes of dead cgroup %s are still there after SIGKILL", directory)
                    if killed:
                        found.append(Reclaimed(instance, directory.name, killed))
            except OSError as exc:
                log.warning("cannot kill what is left in cgroup %s: %s", directory, exc)
        if not kept:
            remove_tree(top)
            return found
        # A spared workload's directories stay, in every hierarchy, and so does its instance's.
        for directory in subdirectories(top):
            if directory.name not in kept:
                remove_tree(directory)
        return found

    def close(self) -> None:
        """Remove the workload cgroups left empty, then the instance's own directories; never raises.

        The cgroup of a workload handed over to a successor (see ``handed_over`` in :meth:`open`) is not
        tried, in any hierarchy, and neither are the instance's directories that hold it: it is its
        adopter's now, and a failed removal of it would be no news. What else cannot be removed is
        logged as a warning.
        """
        if self.path is None:
            return
        try:
            kept = self._handed_over_cgroups(self.path)
            for top in dict.fromkeys([self.path, *self._v1.values()]):
                for directory in subdirectories(top):
                    if directory.name not in kept:
                        remove_tree(directory)
                if kept:
                    log.debug(
                        "cgroup %s stays: it holds workloads handed over (%s)",
                        top,
                        ", ".join(f"{name}: pid {pid}" for name, pid in kept.items()),
                    )
                else:
                    remove_directory(top)
        except Exception:
            log.exception("cannot remove the cgroups of instance %s", self.instance)

    def _handed_over_cgroups(self, top: Path) -> dict[str, int]:
        """The workload cgroups under ``top`` that hold a handed-over workload -> its pid."""
        kept: dict[str, int] = {}
        for directory in subdirectories(top):
            cgroup = WorkloadCgroup(directory.name, directory, {}, Limits(), "")
            try:
                members = cgroup.members()
            except OSError:
                continue  # unreadable: its removal is tried, and says why it fails
            handed = next((pid for pid in members if self._handed_over(pid)), None)
            if handed is not None:
                kept[directory.name] = handed
        return kept


def workload_cgroup_of(pid: int, mountinfo: str = MOUNTINFO) -> WorkloadCgroup | None:
    """The workload cgroup process ``pid`` is in, as made by whichever instance launched it, for its accounting.

    An adopted workload was launched (and its cgroup made) by another instance: this finds that cgroup
    from where the kernel says the process is, ``ale-<instance>/<workload>`` on cgroup2, with the cgroup
    v1 directories of the same name it is in (its memory accounting on a hybrid host). Its limits are
    not known here (:attr:`WorkloadCgroup.limits` is empty): it is for :meth:`WorkloadCgroup.usage`.

    :param pid: the workload's process
    :param mountinfo: where the mounts are listed
    :returns: the cgroup; None when the process is gone, or is in no workload cgroup (uncontained)
    """
    where = own_cgroups(f"/proc/{pid}/cgroup")
    path = where.get("")
    if path is None:
        return None
    relative = PurePosixPath(path)
    if names.instance_of(relative.parent.name) is None or not names.is_safe(relative.name):
        return None  # in the scheduler's own cgroup, or anyone else's: not one workload's alone
    mounts = cgroup_mounts(mountinfo)
    mount = cgroup2_entry(mountinfo)
    if mount is None:
        return None
    directory = directory_of(mount.point, mount.root, path)
    if directory == mount.point:
        return None  # outside the part of the hierarchy mounted here
    v1: dict[str, Path] = {}
    for controller, point in v1_mounts(mountinfo).items():
        inside = where.get(controller)
        # Only a v1 directory of its own: one that has moved back to its parent's (a CPU share restored) is
        # not the workload's alone.
        if (
            controller in LIMITED
            and inside is not None
            and PurePosixPath(inside).parts[-2:] == relative.parts[-2:]
        ):
            root = next((m.root for m in mounts if m.point == point), "/")
            v1[controller] = directory_of(point, root, inside)
    return WorkloadCgroup(relative.name, directory, v1, Limits(), path)


def recorded_cgroup(recorded: Path, pid: int, mountinfo: str = MOUNTINFO) -> WorkloadCgroup | None:
    """The cgroup a handed-over workload was recorded in, for its adopter to signal, settle and remove;
    with its cgroup v1 directories (:func:`workload_cgroup_of`) while ``pid`` is still in it.

    Always the recorded directory, never one found through ``pid`` alone: the process may have exited
    since it was recorded, and its pid been reused by a process of another workload's cgroup.

    :returns: the cgroup; None when the directory is gone
    """
    if not recorded.is_dir():
        return None
    found = workload_cgroup_of(pid, mountinfo)
    if found is not None and found.path == recorded:
        return found
    return WorkloadCgroup(recorded.name, recorded, {}, Limits(), "")


def _spared(spare: Collection[str], directory: str, relative: str) -> bool:
    """Whether a workload cgroup, or one below it, is in ``spare`` (by its directory or its cgroup path)."""
    return any(
        each in (directory, relative) or each.startswith((f"{directory}/", f"{relative}/")) for each in spare
    )


def _live(is_live: Callable[[str], bool], instance: str) -> bool:
    try:
        return is_live(instance)
    except Exception:
        log.exception("cannot tell whether instance %s runs; leaving its cgroups", instance)
        return True
