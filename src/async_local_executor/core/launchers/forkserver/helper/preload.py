"""In the fork-server helper: import learned modules one at a time, refusing what would harm a workload.

The names come from what workloads imported (:mod:`async_local_executor.core.launchers.forkserver.learning`).
Each one is checked before it is imported, and watched while it is:

- it must belong to an installed distribution, and be found where that distribution is installed: a
  module of the DAGs folder or of a bundle, imported here, would keep every task on the code of the
  day the helper started, where a changed file must take effect on the next task;
- the helper's memory must not have grown past its budget for learned modules;
- it must import without raising (a module that does not is skipped: the task imports it itself and
  meets the error, or not, exactly as it would have);
- it must leave no thread running (the helper must stay single-threaded to fork), create no random
  generator every task would then share, draw nothing from NumPy's global one, and leave no descriptor
  open (:mod:`~async_local_executor.core.launchers.forkserver.helper.hygiene`). Neither can be undone: the helper
  stops there, says which module did it, and exits; the launcher refuses that module and starts a
  helper without it, while the previous one goes on serving.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from async_local_executor.core.launchers.forkserver.helper.hygiene import (
    REFUSALS,
    ImportWatch,
    kept_warnings_filters,
)
from async_local_executor.core.launchers.forkserver.helper.threads import (
    ThreadCensus,
    stop_known_pools,
    thread_ids,
)
from async_local_executor.core.launchers.forkserver.protocol import Loaded, PreloadReport, Refused

KIB = 1024
# Refusals for what a module is, the same on every try (the others may pass: the launcher retries them).
NOT_INSTALLED = "not a module of an installed distribution"
NOT_ON_PATH = "not found on the fork server's path"
SHADOWED = "found at "
PERMANENT_REFUSALS = (NOT_INSTALLED, NOT_ON_PATH, SHADOWED, *REFUSALS)


class Unfit(Exception):
    """Importing ``module`` did what cannot be undone (a thread, a shared generator): this helper must not fork."""

    def __init__(self, module: str, reason: str, report: PreloadReport) -> None:
        super().__init__(reason)
        self.module = module
        self.reason = reason
        self.report = report


def resident() -> int:
    """This process's resident memory in bytes (``/proc/self/statm``), 0 when unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def installed_roots() -> dict[str, list[str]]:
    """Top-level module name -> the installed distributions that provide it."""
    from importlib import metadata

    try:
        return dict(metadata.packages_distributions())
    except Exception:  # noqa: BLE001 - broken metadata of one distribution must not stop the helper
        return {}


def _location(root: str) -> str | None:
    """Where ``root`` would be imported from, without importing it."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec(root)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        return os.path.realpath(spec.origin)
    locations = list(spec.submodule_search_locations or ())
    return os.path.realpath(locations[0]) if locations else None


def _site_of(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return os.path.realpath(str(metadata.distribution(distribution).locate_file("")))
    except Exception:  # noqa: BLE001 - a distribution without usable metadata is not trusted
        return None


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except Exception:  # noqa: BLE001
        return None


def _distribution(root: str, roots: dict[str, list[str]], cache: dict[str, Any]) -> tuple[str | None, str]:
    """The distribution ``root`` comes from, or ``None`` and why it is not trusted."""
    if root in cache:
        return cache[root]  # type: ignore[no-any-return]
    dists = roots.get(root)
    verdict: tuple[str | None, str]
    where = _location(root)
    if not dists:
        # Found here or not (the DAGs folder is on the task's path, not always on the helper's).
        place = f"{where}: the DAGs folder, a bundle?" if where else "the DAGs folder, a bundle, or none"
        verdict = (None, f"{NOT_INSTALLED} ({place})")
    elif where is None:
        verdict = (None, NOT_ON_PATH)
    else:
        site = next((d for d in dists if (s := _site_of(d)) and where.startswith(s + os.sep)), None)
        verdict = (site, "") if site else (None, f"{SHADOWED}{where}, outside the distribution {dists[0]}")
    cache[root] = verdict
    return verdict


def _is_attribute(name: str) -> bool:
    """Whether ``name`` is something a loaded module defines (``from pkg import name``), not a module."""
    parent, _, last = name.rpartition(".")
    owner = sys.modules.get(parent) if parent else None
    if owner is None:
        return False
    try:
        with warnings.catch_warnings():  # a deprecated name warns when it is looked up, as if it were used
            warnings.simplefilter("ignore")
            value = getattr(owner, last, None)
    except Exception:  # noqa: BLE001 - a lazy export whose import fails: not here
        return False
    return value is not None and not isinstance(value, types.ModuleType)


class _NoImports(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: every import of a module not imported yet fails, before it runs."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        raise ImportError(f"{fullname} is not imported, and a fork server's check imports nothing")


def check(names: Sequence[str], base: frozenset[str]) -> tuple[list[str], list[Refused]]:
    """Which of ``names`` the helper has already, and which no helper would ever preload (with why).

    Had already: imported before any learned module (``base``), or defined by such a module; a module
    a learned one brought in is not, so that its file is watched for upgrades as a preloaded one.
    A name a module exports lazily (through its ``__getattr__``, as the task SDK does) counts when what
    it needs is imported: imports are refused meanwhile. Run in a child forked for the question
    (:mod:`.server`): whatever the lookups do stays there.
    """
    refuse = _NoImports()
    sys.meta_path.insert(0, refuse)
    try:
        covered = [n for n in names if n in base or (n.rpartition(".")[0] in base and _is_attribute(n))]
    finally:
        sys.meta_path.remove(refuse)
    roots = installed_roots()
    if not roots:  # metadata unreadable for now (an install under way): no verdict that lasts
        return covered, []
    cache: dict[str, Any] = {}
    refused = []
    for name in set(names).difference(covered):
        distribution, why = _distribution(name.partition(".")[0], roots, cache)
        if distribution is None:
            refused.append(Refused(name, why))
    return covered, sorted(refused, key=lambda r: r.module)


def preload_learned(
    modules: Sequence[str],
    *,
    budget: int,
    census: ThreadCensus,
    settle: float,
    progress: Callable[[str], None] = lambda _: None,
) -> PreloadReport:
    """Import what is safe of ``modules``; the report the helper sends in its ready message.

    :param budget: bytes the helper's resident memory may grow by for these modules (0: no limit)
    :param progress: told each module just before it is imported (so a crash or hang can be blamed)
    :raises Unfit: a module left a thread running (the report so far is on the exception)
    """
    baseline = set(sys.modules)
    roots = installed_roots()
    cache: dict[str, Any] = {}
    start = resident()
    loaded: list[Loaded] = []
    refused: list[Refused] = []
    covered: list[str] = []

    def report() -> PreloadReport:
        return PreloadReport(tuple(loaded), tuple(refused), tuple(covered))

    watch = ImportWatch()
    main_thread = {os.getpid()}
    # Airflow parses DAG files inside catch_warnings(): filters their imports add never reach a task.
    with kept_warnings_filters():
        for name in modules:
            if name in baseline or _is_attribute(name):
                covered.append(name)  # already here, or a name a module defines rather than a module
                continue
            distribution, why = _distribution(name.partition(".")[0], roots, cache)
            if distribution is None:
                refused.append(Refused(name, why))
                continue
            if name not in sys.modules:
                if budget and resident() - start >= budget:
                    used_up = f"the helper's memory budget for learned modules ({budget // KIB // KIB} MiB) is used up"
                    refused.append(Refused(name, used_up))
                    continue
                progress(name)
                before = resident()
                try:
                    with census.watching(name), watch.watching():
                        importlib.import_module(name)
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - the task meets it, or not, on its own
                    refused.append(Refused(name, f"import failed: {type(exc).__name__}: {exc}"[:300]))
                    continue
                if watch.problems:
                    raise Unfit(name, "; ".join(watch.problems), report())
                if thread_ids() - main_thread:
                    stop_known_pools()  # NumPy's OpenBLAS: its idle workers stop, and restart in each task
                    census.settle(settle)
                    if (reason := census.unfit()) is not None:
                        raise Unfit(name, f"importing it starts a thread: {reason}", report())
                kib = max(0, resident() - before) // KIB
            else:
                kib = 0  # brought in by a module before it
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None)
            loaded.append(Loaded(name, distribution, _version(distribution), kib, path))
    return report()
