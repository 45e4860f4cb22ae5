"""The launcher's memory of what workloads import: what to try next, what is preloaded, what was refused.

Names come from two places: the top-level imports of the files workloads run (read without running
them, :mod:`~async_local_executor.core.launchers.forkserver.learning.source`) and what workload processes loaded while they
ran (:mod:`~async_local_executor.core.launchers.forkserver.learning.observe`). Which of them a helper may import is decided
by the helper itself, the only process that can import them without harm
(:mod:`~async_local_executor.core.launchers.forkserver.helper.preload`); this keeps its verdicts.

A preloaded module is remembered with the size and time of its file: when an upgrade (``pip install
-U``) replaces the file, a new helper is wanted, which imports the new code. The preloaded names are
kept in a file, so a restarted scheduler tries them again at once instead of waiting for tasks to
teach it again. Scanning reads files: :meth:`Learned.scan` runs in a worker thread and returns what
:meth:`Learned.apply` then records on the loop thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from async_local_executor.core.launchers.base import PreloadSummary
from async_local_executor.core.launchers.forkserver.helper.preload import PERMANENT_REFUSALS
from async_local_executor.core.launchers.forkserver.learning import observe, source
from async_local_executor.core.launchers.forkserver.protocol import Checked, PreloadReport

# Files read per scan: a DAGs folder of thousands is read over several scans, not in one burst of CPU.
FILES_PER_SCAN = 100
# More names than this are not tried (a task importing thousands of new modules is no pattern to learn).
MAX_CANDIDATES = 2000
MAX_REASON = 300
# Never preloaded: what the fork server has already imported, and what is no module of a library.
ALWAYS_EXCLUDED = ("__main__", "async_local_executor")
# Refusals that come from what the module is are the same on every try (PERMANENT_REFUSALS, from the
# helper that makes them). Any other (a thread still running when counted, a crash or a hang while
# importing, an import that failed, the memory budget) may come from the moment: the module is tried
# again later, after RETRY_FIRST seconds, doubling up to RETRY_MAX, instead of never again.
RETRY_FIRST = 600.0
RETRY_MAX = 6 * 3600.0


def permanent(reason: str) -> bool:
    """Whether a refusal for ``reason`` would be the same on every try."""
    return reason.startswith(PERMANENT_REFUSALS)


@dataclass(frozen=True)
class Preloaded:
    """One module a helper imported: where it came from, what it cost, and the file that says if it changed."""

    module: str
    distribution: str | None
    version: str | None
    kib: int
    file: str | None
    stamp: tuple[int, int] | None  # (size, mtime_ns) of ``file`` when the helper imported it


@dataclass
class Scan:
    """What a scan found, to apply on the loop thread."""

    names: list[str] = field(default_factory=list)
    parsed: dict[str, int] = field(default_factory=dict)  # file -> mtime_ns read
    changed: list[str] = field(default_factory=list)  # preloaded modules whose file changed
    more: bool = False  # files left to read next time


def stamp(path: str | None) -> tuple[int, int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def excluded(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in patterns)


class Learned:
    """What to preload, learned as workloads run.

    :param directory: where workload processes record what they load (and the preloaded set is kept)
    :param exclude: modules (and their submodules) never to preload
    """

    def __init__(self, directory: str, *, exclude: Sequence[str] = ()) -> None:
        self.directory = directory
        self._exclude = (*ALWAYS_EXCLUDED, *exclude)
        self._files: dict[str, int | None] = {}  # file -> mtime_ns last parsed (None: not yet)
        self.pending: dict[str, None] = {}  # names not tried yet, in the order learned
        self.preloaded: dict[str, Preloaded] = {}
        self.refused: dict[str, str] = {}
        self._covered: set[str] = set()  # names that cost nothing: already imported, or not modules
        self._changed: list[str] = []
        self._retries: dict[str, tuple[float, int]] = {}  # refused for now: (when to try again, tries)
        self.generation = 0  # helpers that took a learned set
        for name in self._load():
            self._learn(name)

    @property
    def _store(self) -> str:
        return os.path.join(self.directory, "preloaded.json")

    def saw_file(self, path: str | None) -> bool:
        """A workload will run ``path``; True when it is new (a scan is worth doing soon)."""
        if not path or path in self._files:
            return False
        self._files[path] = None
        return True

    def scan(self) -> Scan:
        """Read what is new: files not parsed (or changed since), workloads' records, preloaded files."""
        found = Scan()
        for path, seen in list(self._files.items()):
            current = stamp(path)
            if current is None or current[1] == seen:
                continue
            if len(found.parsed) >= FILES_PER_SCAN:
                found.more = True
                break
            found.parsed[path] = current[1]
            found.names.extend(source.top_level_imports(path))
        found.names.extend(observe.read(self.directory))
        # A snapshot: the loop thread may refuse a module (and so change the dict) while this runs.
        preloaded = list(self.preloaded.values())
        found.changed.extend(p.module for p in preloaded if p.file and stamp(p.file) != p.stamp)
        return found

    def apply(self, found: Scan) -> bool:
        """Record a scan; True when a new helper is wanted (new names to try, or a preloaded file changed)."""
        self._files.update(found.parsed)
        for name in found.names:
            self._learn(name)
        for module in found.changed:
            if module not in self._changed:
                self._changed.append(module)
        return self.wanted

    @property
    def wanted(self) -> bool:
        return bool(self.pending or self._changed)

    def plan(self) -> list[str]:
        """The modules the next helper should try, in order: those preloaded now, then the new ones."""
        return [*self.preloaded, *self.pending]

    def trusted(self) -> list[str]:
        """What a helper started on demand (after a crash, say) imports: what a helper already took."""
        return list(self.preloaded)

    def took(self, report: PreloadReport, tried: Sequence[str], now: float = 0.0) -> str | None:
        """Record the verdicts of a helper that took ``tried``; what changed, in words, or ``None``.

        :param now: the launcher's clock (monotonic): when a refusal that may pass is tried again
        """
        before, refused_before = set(self.preloaded), set(self.refused)
        preloaded: dict[str, Preloaded] = {}
        for row in report.loaded:
            preloaded[row.module] = Preloaded(
                row.module, row.distribution, row.version, row.kib, row.path, stamp(row.path)
            )
        for refused in report.refused:
            self._refused(refused.module, refused.reason, now)
        self._covered.update(report.covered)
        self.preloaded = preloaded
        for name in tried:
            self.pending.pop(name, None)
        self._changed = [m for m in self._changed if m not in tried]
        self.generation += 1
        self._save()
        added = [m for m in preloaded if m not in before]
        dropped = sorted(before - set(preloaded))
        newly_refused = [m for m in self.refused if m not in refused_before]
        if not (added or dropped or newly_refused):
            return None
        parts = [f"{len(preloaded)} learned modules preloaded"]
        if added:
            parts.append(f"added {few(added)}")
        if dropped:
            parts.append(f"dropped {few(dropped)}")
        if newly_refused:
            parts.append("refused " + few([f"{m} ({self.refused[m]})" for m in newly_refused]))
        return "; ".join(parts)

    def checked(self, answer: Checked, now: float) -> list[str]:
        """Record what the serving helper said of pending names; those it refused, newly.

        What it has already costs nothing to preload; what it refused (a module of the DAGs folder, say)
        no helper would take. Neither is worth starting one.
        """
        for name in answer.covered:
            self._covered.add(name)
            self.pending.pop(name, None)
        newly = []
        for refused in answer.refused:
            if refused.module in self.pending:
                self._refused(refused.module, refused.reason, now)
                self.pending.pop(refused.module)
                newly.append(refused.module)
        return newly

    def refuse(self, module: str, reason: str, now: float = 0.0) -> None:
        """A helper could not take ``module`` (it started a thread, crashed or hung while importing it)."""
        self._refused(module, reason, now)
        self.pending.pop(module, None)
        self.preloaded.pop(module, None)
        self._save()

    def retry_due(self, now: float) -> bool:
        """Put back what was refused for a reason that may pass, once its wait is over; True if any."""
        due = [m for m, (when, _) in self._retries.items() if when <= now and m in self.refused]
        for module in due:
            del self.refused[module]
            self.pending[module] = None
        return bool(due)

    def _refused(self, module: str, reason: str, now: float) -> None:
        self.refused[module] = reason[:MAX_REASON]
        if permanent(reason):
            self._retries.pop(module, None)
            return
        tries = self._retries.get(module, (0.0, 0))[1] + 1
        self._retries[module] = (now + min(RETRY_FIRST * 2 ** (tries - 1), RETRY_MAX), tries)

    def as_dict(self) -> PreloadSummary:
        """For the status file and the status command."""
        return {
            "mode": "auto",
            "preloaded": [
                {"module": p.module, "distribution": p.distribution, "version": p.version, "kib": p.kib}
                for p in self.preloaded.values()
            ],
            "refused": [
                {"module": m, "reason": r, "retried": m in self._retries} for m, r in self.refused.items()
            ],
            "pending": list(self.pending)[:50],
            "generation": self.generation,
        }

    def _learn(self, name: str) -> None:
        if (
            not name
            or name in self.pending
            or name in self.preloaded
            or name in self.refused
            or name in self._covered
            or excluded(name, self._exclude)
            # No distribution's: never preloaded, and too common to list as refused.
            or name.partition(".")[0] in sys.stdlib_module_names
            or len(self.pending) >= MAX_CANDIDATES
            or not all(part.isidentifier() for part in name.split("."))
        ):
            return
        self.pending[name] = None

    def _load(self) -> list[str]:
        with contextlib.suppress(OSError, ValueError):
            with open(self._store, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, list):
                return [str(n) for n in data]
        return []

    def _save(self) -> None:
        # A name of its own (mkstemp: 0600, O_EXCL): a writer never truncates another's half-written file.
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(prefix=".preloaded-", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(list(self.preloaded), f)
                os.replace(tmp, self._store)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def few(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
