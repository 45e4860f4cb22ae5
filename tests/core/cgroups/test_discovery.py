"""Finding the cgroup mounts and a process's cgroups (this host's /proc and synthetic tables), and limits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from async_local_executor.core.cgroups import (
    Limits,
    cgroup2_mount,
    cgroup_of,
    format_bytes,
    own_cgroups,
    parse_cpu,
    parse_memory,
    parse_pids,
    v1_mounts,
)
from async_local_executor.core.cgroups.discovery import cgroup_path, directory_of, mount_root

# A hybrid host: cgroup2 beside v1 hierarchies, one of them combined, plus a named one and a space.
HYBRID = """\
22 1 0:20 / /sys rw,nosuid - sysfs sysfs rw
31 22 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:5 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/my\\040pids rw,relatime - cgroup cgroup rw,nosuid,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
"""
# A container that sees a subtree of the hierarchy bind-mounted first, then the whole of it.
CONTAINER = """\
50 1 0:40 /docker/abc /sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw
51 1 0:40 / /host/cgroup rw,relatime - cgroup2 cgroup2 rw
"""
NO_CGROUP2 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_synthetic_hybrid_mounts(tmp_path: Path) -> None:
    mountinfo = write(tmp_path, "mountinfo", HYBRID)
    assert cgroup2_mount(mountinfo) == Path("/sys/fs/cgroup/unified")
    mounts = v1_mounts(mountinfo)
    # The combined mount gives each of its controllers; options and names are not controllers.
    assert mounts["cpu"] == mounts["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert mounts["memory"] == Path("/sys/fs/cgroup/memory")
    assert mounts["pids"] == Path("/sys/fs/cgroup/my pids")
    assert set(mounts) == {"cpu", "cpuacct", "memory", "pids"}


def test_no_cgroup2_mount(tmp_path: Path) -> None:
    mountinfo = write(tmp_path, "mountinfo", NO_CGROUP2)
    assert cgroup2_mount(mountinfo) is None
    assert v1_mounts(mountinfo) == {"memory": Path("/sys/fs/cgroup/memory")}
    assert cgroup2_mount(str(tmp_path / "missing")) is None


def test_a_bind_mounted_subtree_maps_paths(tmp_path: Path) -> None:
    mountinfo = write(tmp_path, "mountinfo", CONTAINER)
    # The whole hierarchy is preferred where it is visible.
    assert cgroup2_mount(mountinfo) == Path("/host/cgroup")
    point = Path("/sys/fs/cgroup")
    assert mount_root(point, mountinfo) == "/docker/abc"
    assert directory_of(point, "/docker/abc", "/docker/abc/x") == point / "x"
    assert directory_of(point, "/docker/abc", "/docker/abc") == point
    assert cgroup_path(point, "/docker/abc", point / "x" / "y") == "/docker/abc/x/y"
    assert cgroup_path(Path("/m"), "/", Path("/m")) == "/"


def test_synthetic_proc_cgroup(tmp_path: Path) -> None:
    proc = write(
        tmp_path,
        "cgroup",
        "9:name=systemd:/\n4:memory:/process_api/ee9c\n2:cpu,cpuacct:/odd:name\n0::/a/b\n",
    )
    assert own_cgroups(proc) == {
        "name=systemd": "/",
        "memory": "/process_api/ee9c",
        "cpu": "/odd:name",
        "cpuacct": "/odd:name",
        "": "/a/b",
    }
    assert own_cgroups(str(tmp_path / "missing")) == {}


def test_this_hosts_tables() -> None:
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 mount on this host")
    assert (mount / "cgroup.procs").is_file()
    own = own_cgroups()
    assert own[""] == cgroup_of(os.getpid())
    assert (directory_of(mount, mount_root(mount), own[""]) / "cgroup.procs").is_file()
    for controller, point in v1_mounts().items():
        # Each v1 hierarchy is a directory of cgroups, and this process is in one of its cgroups.
        assert (point / "cgroup.procs").is_file(), controller
        if controller in own:
            assert (directory_of(point, mount_root(point), own[controller]) / "cgroup.procs").is_file()


def test_cgroup_of_a_gone_process_is_none() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=False, capture_output=True, text=True
    )
    pid = int(child.stdout)
    assert cgroup_of(pid) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("536870912", 536870912),
        ("512M", 512 * 1024**2),
        ("512MiB", 512 * 1024**2),
        ("512mb", 512 * 1024**2),
        ("1G", 1024**3),
        ("1.5GiB", 1536 * 1024**2),
        ("100k", 102400),
        (" 2 T ", 2 * 1024**4),
        ("12B", 12),
    ],
)
def test_parse_memory(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1M", "1.5", "12 parsecs", "1e9", "M", "nan", "1.5X"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^memory limit must be .* got '{text}'$"):
        parse_memory(text)


def test_parse_cpu_and_pids() -> None:
    assert parse_cpu("0.5") == 0.5
    assert parse_cpu("2") == 2.0
    assert parse_cpu("4096") == 4096.0
    for bad in ("0", "-1", "4097", "nan", "inf", "half", ""):
        with pytest.raises(ValueError, match=f"cpu limit must .* got '{bad}'"):
            parse_cpu(bad)
    assert parse_pids("100") == 100
    for bad in ("0", "-3", "1.0", "many", ""):
        with pytest.raises(ValueError, match=f"pids limit must .* got '{bad}'"):
            parse_pids(bad)


def test_limits_merge_describe_and_format() -> None:
    base = Limits(memory=512 * 1024**2, cpu=0.5)
    assert Limits().empty
    assert not base.empty
    assert base.merged(Limits(cpu=2, pids=100)) == Limits(memory=512 * 1024**2, cpu=2, pids=100)
    assert base.merged(Limits()) == base
    assert Limits(memory=512 * 1024**2, cpu=0.5, pids=100).describe() == "memory 512 MiB, cpu 0.5, pids 100"
    assert Limits(cpu=2).describe() == "cpu 2"
    assert Limits().describe() == ""
    assert [format_bytes(n) for n in (512 * 1024**2, 1536 * 1024**2, 102400, 12)] == [
        "512 MiB",
        "1.5 GiB",
        "100 KiB",
        "12 B",
    ]
