"""Where the cgroup hierarchies are mounted and where a process sits in them, from /proc.

Nothing is assumed about mount points: a modern host mounts cgroup2 at /sys/fs/cgroup, a hybrid one at
/sys/fs/cgroup/unified with the controllers on cgroup v1 hierarchies beside it, a container wherever its
runtime chose. The kernel's own tables say which.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
PROC_CGROUP = "/proc/self/cgroup"

# The kernel's v1 controllers: a v1 mount's super options also hold flags (rw, noprefix, xattr, ...)
# and named hierarchies (name=systemd), which are not.
V1_CONTROLLERS = frozenset(
    {"blkio", "cpu", "cpuacct", "cpuset", "debug", "devices", "freezer", "hugetlb", "memory", "misc"}
    | {"net_cls", "net_prio", "perf_event", "pids", "rdma"}
)


@dataclass(frozen=True)
class Mount:
    """One cgroup mount: which part of its hierarchy (``root``) is visible at ``point``."""

    root: str
    point: Path
    fstype: str
    options: tuple[str, ...]


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """Every cgroup and cgroup2 mount listed in ``mountinfo``, in its order.

    :param mountinfo: a file in the format of /proc/self/mountinfo
    :returns: the mounts; [] when the file cannot be read
    """
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return []
    found: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        found.append(Mount(root, point, tail[0], tuple(tail[2].split(","))))
    return found


def cgroup2_entry(mountinfo: str = MOUNTINFO) -> Mount | None:
    """The cgroup2 mount, with which part of the hierarchy it shows.

    :param mountinfo: a file in the format of /proc/self/mountinfo
    :returns: the mount, or None when cgroup2 is not mounted
    """
    mounts = [m for m in cgroup_mounts(mountinfo) if m.fstype == "cgroup2"]
    # A bind mount of a subtree may come first; the whole hierarchy, when visible, is the one to use.
    whole = [m for m in mounts if m.root == "/"]
    return next(iter(whole or mounts), None)


def cgroup2_mount(mountinfo: str = MOUNTINFO) -> Path | None:
    """The mount point of the cgroup2 hierarchy.

    :param mountinfo: a file in the format of /proc/self/mountinfo
    :returns: the mount point, or None when cgroup2 is not mounted
    """
    mount = cgroup2_entry(mountinfo)
    return mount.point if mount is not None else None


def v1_mounts(mountinfo: str = MOUNTINFO) -> dict[str, Path]:
    """The cgroup v1 hierarchies by controller.

    :param mountinfo: a file in the format of /proc/self/mountinfo
    :returns: controller name -> mount point; a combined mount (``cpu,cpuacct``) gives each of its names
    """
    found: dict[str, Path] = {}
    for mount in cgroup_mounts(mountinfo):
        if mount.fstype != "cgroup":
            continue
        for option in mount.options:
            if option in V1_CONTROLLERS:
                found.setdefault(option, mount.point)
    return found


def mount_root(point: Path, mountinfo: str = MOUNTINFO) -> str:
    """Which cgroup of its hierarchy is mounted at ``point`` (``/`` unless a subtree was bind-mounted).

    :param point: a cgroup mount point
    :param mountinfo: a file in the format of /proc/self/mountinfo
    :returns: the cgroup path, as /proc/<pid>/cgroup would show it
    """
    for mount in cgroup_mounts(mountinfo):
        if mount.point == point:
            return mount.root
    return "/"


def directory_of(point: Path, root: str, cgroup: str) -> Path:
    """The directory of cgroup ``cgroup`` under a mount of its hierarchy whose root is ``root``.

    :param point: the mount point
    :param root: the cgroup mounted there (see :func:`mount_root`)
    :param cgroup: a cgroup path as /proc/<pid>/cgroup shows it
    :returns: the directory; ``point`` itself when ``cgroup`` is outside the mounted subtree
    """
    path, top = PurePosixPath(cgroup), PurePosixPath(root)
    if path == top:
        return point
    if top in path.parents:
        return point / path.relative_to(top)
    return point


def cgroup_path(point: Path, root: str, directory: Path) -> str:
    """The cgroup path of ``directory`` as /proc/<pid>/cgroup shows it (the inverse of :func:`directory_of`).

    :param point: the mount point
    :param root: the cgroup mounted there
    :param directory: a directory under ``point``
    :returns: the cgroup path, starting with ``/``
    """
    inside = PurePosixPath(directory).relative_to(point)
    return str(PurePosixPath(root) / inside) if str(inside) != "." else root


def make_root(mount: Path, root: str) -> tuple[Path, list[Path]]:
    """The directory of a configured cgroup2 root, created with its missing parents.

    :param mount: the cgroup2 mount point
    :param root: a cgroup path relative to it, such as ``/airflow``
    :returns: the directory, and its parent followed by each directory created (empty when none was)
    :raises ValueError: when ``root`` climbs out of the mount
    :raises OSError: when a directory cannot be created (the message names it)
    """
    parts = PurePosixPath(root).parts
    if ".." in parts:
        raise ValueError("must be a cgroup path below the mount, such as /airflow")
    directory, created = mount, []
    for part in parts[1:] if root.startswith("/") else parts:
        directory = directory / part
        if directory.is_dir():
            continue
        if directory.exists():
            raise OSError(errno.ENOTDIR, f"{directory} is not a directory")
        try:
            directory.mkdir()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create {directory}: {exc.strerror or exc}") from exc
        created.append(directory)
    return directory, [created[0].parent, *created] if created else []


def own_cgroups(proc_cgroup: str = PROC_CGROUP) -> dict[str, str]:
    """Where a process sits: its cgroup in each hierarchy.

    :param proc_cgroup: a file in the format of /proc/self/cgroup
    :returns: ``""`` -> the cgroup2 path, each v1 controller name (``memory``, ``name=systemd``) -> its path;
        {} when the file cannot be read
    """
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            found[""] = path
        for controller in filter(None, controllers.split(",")):
            found[controller] = path
    return found


def cgroup_of(pid: int) -> str | None:
    """The cgroup2 path of process ``pid`` (its ``0::`` line).

    :param pid: a process id
    :returns: the path, or None when the process is gone or has no cgroup2 line
    """
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def enable_controllers(directory: Path, controllers: Sequence[str]) -> None:
    """Enable ``controllers`` for ``directory``'s children, each where the kernel allows it; never raises."""
    if _holds_processes(directory):
        # In a non-root cgroup that holds processes, the kernel refuses memory and accepts cpu and pids
        # by turning the cgroup into a threaded domain, whose children then refuse every process
        # (EOPNOTSUPP): no workload could join its cgroup. Such a parent gets containment, not limits.
        log.debug("not enabling controllers in %s: it holds processes", directory)
        return
    # One controller per write: the kernel rejects a whole line when any of its controllers is unavailable.
    for controller in controllers:
        try:
            (directory / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError as exc:
            log.debug("cannot enable %s in %s: %s", controller, directory, exc)


def _holds_processes(directory: Path) -> bool:
    """A non-root cgroup with processes of its own (the root cgroup has no ``cgroup.type``)."""
    if not (directory / "cgroup.type").exists():
        return False
    try:
        return bool((directory / "cgroup.procs").read_text().split())
    except OSError:
        return True  # unreadable: leave it as it is
