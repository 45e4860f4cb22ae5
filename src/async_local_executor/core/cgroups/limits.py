"""Resource limits of a workload (memory, CPU, pids): the values, their parsing and their display.

Sizes are binary (``512M`` is 512 MiB) because the kernel counts memory in pages, and an operator who
writes ``1G`` for a 1 GiB container means the same number the kernel reports back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?$", re.IGNORECASE)
_WHOLE = re.compile(r"^\d+$")
MAX_CPUS = 4096.0
# CPU limits are a quota of microseconds per period of 100 ms; the kernel refuses a quota below 1 ms.
CPU_PERIOD = 100_000
_MIN_QUOTA = 1_000


@dataclass(frozen=True)
class Limits:
    """What one workload may use; None means no limit of that kind."""

    memory: int | None = None
    """Bytes."""
    cpu: float | None = None
    """CPUs, e.g. 0.5 or 2."""
    pids: int | None = None
    """Processes and threads at once."""

    def merged(self, override: Limits) -> Limits:
        """These limits with every limit ``override`` sets in their place.

        :param override: limits that win where they are not None (a task's own over the executor's)
        :returns: the combined limits
        """
        return Limits(
            memory=override.memory if override.memory is not None else self.memory,
            cpu=override.cpu if override.cpu is not None else self.cpu,
            pids=override.pids if override.pids is not None else self.pids,
        )

    @property
    def empty(self) -> bool:
        """True when no limit is set."""
        return self.memory is None and self.cpu is None and self.pids is None

    def describe(self) -> str:
        """The limits for a log line: ``memory 512 MiB, cpu 0.5, pids 100``; ``""`` when empty.

        :returns: the description
        """
        parts: list[str] = []
        if self.memory is not None:
            parts.append(f"memory {format_bytes(self.memory)}")
        if self.cpu is not None:
            parts.append(f"cpu {self.cpu:g}")
        if self.pids is not None:
            parts.append(f"pids {self.pids}")
        return ", ".join(parts)


@dataclass(frozen=True)
class LimitWrite:
    """One file to write for a limit: in the cgroup2 directory (``hierarchy`` ``""``) or a v1 controller's."""

    hierarchy: str
    file: str
    value: str
    required: bool = True
    """False: written only where the file exists (swap accounting is a boot option)."""


def limit_writes(limits: Limits, where: Mapping[str, str]) -> list[LimitWrite]:
    """The files that set ``limits``, in the order the kernel accepts them.

    :param limits: the limits
    :param where: controller -> ``cgroup2`` or ``cgroup v1`` (see ``Containment.controllers``)
    :returns: the writes
    """
    writes: list[LimitWrite] = []
    if limits.memory is not None:
        memory = str(limits.memory)
        if where.get("memory") == "cgroup2":
            # Swap would let a workload past its limit, only slower.
            writes += [LimitWrite("", "memory.max", memory), LimitWrite("", "memory.swap.max", "0", False)]
        else:
            # memsw (memory + swap) may never be below the memory limit: it goes second.
            writes += [
                LimitWrite("memory", "memory.limit_in_bytes", memory),
                LimitWrite("memory", "memory.memsw.limit_in_bytes", memory, False),
            ]
    if limits.cpu is not None:
        quota = max(_MIN_QUOTA, round(limits.cpu * CPU_PERIOD))
        if where.get("cpu") == "cgroup2":
            writes.append(LimitWrite("", "cpu.max", f"{quota} {CPU_PERIOD}"))
        else:
            writes += [
                LimitWrite("cpu", "cpu.cfs_period_us", str(CPU_PERIOD)),
                LimitWrite("cpu", "cpu.cfs_quota_us", str(quota)),
            ]
    if limits.pids is not None:
        writes.append(
            LimitWrite("" if where.get("pids") == "cgroup2" else "pids", "pids.max", str(limits.pids))
        )
    return writes


def parse_memory(text: str) -> int:
    """A memory size in bytes from ``536870912``, ``512M``, ``512MiB``, ``1G``, ``1.5GiB`` or ``100k``.

    :param text: a number of bytes, optionally with a K/M/G/T suffix (binary: 1024), ``B`` or ``iB`` after it
    :returns: the size in bytes, at least 1
    :raises ValueError: when ``text`` is not such a size
    """
    match = _SIZE.match(text.strip())
    if match is not None:
        value = Decimal(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
        # A fraction of a byte is a typo, not a size: "1.5" alone is rejected, "1.5k" is 1536.
        if value >= 1 and value == value.to_integral_value():
            return int(value)
    raise ValueError(f"memory limit must be a size such as 512M or 1.5GiB, got '{text}'")


def parse_cpu(text: str) -> float:
    """A CPU limit in CPUs from ``0.5`` or ``2``.

    :param text: a decimal number above 0 and at most 4096
    :returns: the number of CPUs
    :raises ValueError: when ``text`` is not such a number
    """
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_CPUS:
        raise ValueError(f"cpu limit must be a number of CPUs above 0 and at most 4096, got '{text}'")
    return value


def parse_pids(text: str) -> int:
    """A limit on processes from ``100``.

    :param text: a whole number, at least 1
    :returns: the number
    :raises ValueError: when ``text`` is not such a number
    """
    stripped = text.strip()
    if _WHOLE.match(stripped) and int(stripped) >= 1:
        return int(stripped)
    raise ValueError(f"pids limit must be a whole number of at least 1, got '{text}'")


def format_bytes(n: int) -> str:
    """A size for people: ``512 MiB``, ``1.5 GiB``, ``100 KiB``, ``12 B``.

    :param n: bytes
    :returns: the size in the largest binary unit it reaches, with at most two decimals
    """
    for suffix, unit in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= unit:
            text = f"{n / unit:.2f}".rstrip("0").rstrip(".")
            return f"{text} {suffix}"
    return f"{n} B"
