"""A sandbox's cgroups: its executors make theirs under a root of its own, removed when it stops.

The executor (``containment = auto``) would otherwise make them under the scheduler's own cgroup, and a
scheduler a test kills with SIGKILL leaves them for a successor that a throwaway sandbox never starts.
On a hybrid host the cgroup v1 directories sit beside the scheduler's own v1 cgroups instead; those of
instances whose scheduler is gone are removed too (the same rule the executor's reclaim applies), except
where a process waits in custody for a successor (another sandbox's handed-over task, running beside
this one): its own watchdog ends it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

from async_local_executor.core import custody
from async_local_executor.core.cgroups import cgroup2_mount
from async_local_executor.core.cgroups.discovery import directory_of, mount_root, own_cgroups, v1_mounts
from async_local_executor.core.cgroups.names import instance_of
from async_local_executor.ops.instance_cgroups import owner_lives

ROOT_ENV = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__CGROUP_ROOT"
# Killed processes leave their cgroup at once, but not synchronously: a guard, never a wait for work.
EMPTY_GUARD = 10.0


def usable() -> bool:
    """Whether this host lets the sandbox make cgroups (a cgroup2 mount we can write to)."""
    mount = cgroup2_mount()
    return mount is not None and os.access(mount, os.W_OK)


def sandbox_root() -> str:
    """A fresh cgroup2 path for one sandbox's executors."""
    return f"/ale-sandbox-{uuid4().hex[:8]}"


def sandbox_env() -> dict[str, str]:
    """The environment that gives a new sandbox's executors a cgroup root of their own, where usable."""
    return {ROOT_ENV: sandbox_root()} if usable() else {}


def remove_from(env: dict[str, str]) -> None:
    """:func:`remove` the root ``env`` gave the sandbox's executors, if it gave one."""
    if env.get(ROOT_ENV):
        remove(env[ROOT_ENV])


def remove(root: str) -> None:
    """Kill every process under ``root`` and remove it, and the v1 directories of dead instances."""
    mount = cgroup2_mount()
    if mount is not None:
        _remove_tree(mount / root.strip("/"))
    own = own_cgroups()
    for controller, point in v1_mounts().items():
        if controller not in own:
            continue
        parent = directory_of(point, mount_root(point), own[controller])
        with contextlib.suppress(OSError):
            for directory in parent.iterdir():
                instance = instance_of(directory.name)
                if (
                    instance is not None
                    and not owner_lives(instance)
                    and not any(custody.watched(pid) for pid in _members(directory))
                ):
                    _remove_tree(directory)


@contextlib.contextmanager
def own_v1_cgroups(name: str) -> Iterator[None]:
    """Run this process in a cgroup ``name`` of its own in each cgroup v1 hierarchy an executor uses,
    under the one it is in; at the end move it back and remove that cgroup with whatever is left in it.

    Executors make their cgroups v1 under the cgroup of the process that runs them, and reclaim there
    those of instances whose owner runs no more: test processes side by side (pytest-xdist's workers)
    reclaimed each other's. cgroup2 needs none of this: there each gets a root (:func:`sandbox_env`).
    """
    own = own_cgroups()
    moved: list[tuple[Path, Path]] = []
    for controller, point in v1_mounts().items():
        if controller not in own:
            continue
        parent = directory_of(point, mount_root(point), own[controller])
        mine = parent / name
        try:
            mine.mkdir(exist_ok=True)
        except OSError:
            continue
        try:
            (mine / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            # cpuset's new cgroups have no CPUs or memory nodes until given some: nothing joins them.
            with contextlib.suppress(OSError):
                mine.rmdir()
            continue
        moved.append((parent, mine))
    try:
        yield
    finally:
        for parent, mine in moved:
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(str(os.getpid()))
            _remove_tree(mine)


def _members(top: Path) -> list[int]:
    """The processes in cgroup ``top`` and every cgroup below it."""
    pids: list[int] = []
    for directory, _, _ in os.walk(top):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(pid) for pid in (Path(directory) / "cgroup.procs").read_text().split()]
    return pids


def _remove_tree(top: Path) -> None:
    if not top.is_dir():
        return
    with contextlib.suppress(OSError):
        (top / "cgroup.kill").write_text("1")
    for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        path = Path(directory)
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), 9)
        deadline = time.monotonic() + EMPTY_GUARD
        while path.exists() and time.monotonic() < deadline:
            try:
                path.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
