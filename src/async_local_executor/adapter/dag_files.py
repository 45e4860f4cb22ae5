"""The DAG files tasks will parse, for the fork server to learn their imports from.

Airflow 3 names it by bundle and path within the bundle (the task runner parses
``bundle.path / dag_rel_path``); Airflow 2's ``tasks run`` command names it with ``--subdir``, where
``DAGS_FOLDER`` stands for ``[core] dags_folder``. Only a hint: a file that cannot be found this way
(a bundle version not checked out on the scheduler's side) is learned from what the task's own process
imports instead, and nothing here may fail a workload.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def _hint(find: Callable[[T], str | None]) -> Callable[[T], str | None]:
    @functools.wraps(find)
    def safe(what: T) -> str | None:
        try:
            return find(what)
        except Exception as exc:  # noqa: BLE001 - a hint that cannot be had costs speed, never a task
            log.debug("no DAG file for %r: %s", what, exc)
            return None

    return safe


@_hint
def airflow3(workload: Any) -> str | None:
    """The DAG file an Airflow 3 task workload's process parses, or ``None``."""
    rel = getattr(workload, "dag_rel_path", None)
    bundle = getattr(workload, "bundle_info", None)
    name = getattr(bundle, "name", None)
    if not isinstance(rel, (str, os.PathLike)) or not isinstance(name, str):
        return None  # the workload model has it as a Path
    root = local_bundles().get(name)
    return os.path.join(root, os.fspath(rel)) if root else None


def local_bundles() -> dict[str, str]:
    """Name -> directory of each bundle that is a directory on this host (Airflow 3's LocalDagBundle).

    Read from ``[dag_processor] dag_bundle_config_list`` as Airflow's bundle manager reads it, without
    building the manager (which logs a line each time, and would for every task). A bundle of another
    kind, or one only the manager adds, is learned from its tasks' own processes instead.
    """
    from airflow import settings
    from airflow.configuration import conf

    entries = conf.getjson("dag_processor", "dag_bundle_config_list", fallback=None)
    roots: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and str(entry.get("classpath", "")).endswith(".LocalDagBundle"):
            kwargs = entry.get("kwargs")
            path = kwargs.get("path") if isinstance(kwargs, dict) else None
            roots[str(entry.get("name"))] = str(path or settings.DAGS_FOLDER)
    return roots


@_hint
def airflow2(command: list[str]) -> str | None:
    """The DAG file an Airflow 2 ``airflow tasks run ... --subdir FILE`` command parses, or ``None``."""
    subdir = next((command[i + 1] for i, part in enumerate(command[:-1]) if part in ("--subdir", "-S")), None)
    if not subdir or not subdir.endswith(".py"):
        return None
    if subdir.startswith("DAGS_FOLDER"):
        try:
            from airflow.configuration import conf

            folder = conf.get("core", "dags_folder", fallback="") or ""
        except Exception:  # noqa: BLE001
            return None
        subdir = folder + subdir[len("DAGS_FOLDER") :]
    return os.path.expanduser(subdir)


def local_dag_files() -> list[str]:
    """The DAG files already on this host: those of the local bundles (Airflow 3) or the DAGs folder (2).

    Read once when the executor starts, so the fork server preloads what they import before their
    first tasks come (a bundle fetched from elsewhere, such as git, is learned from its tasks). Found
    as the dag-processor finds them (``.airflowignore``, the safe-mode heuristic); runs in a worker
    thread, and a failure only means there is nothing to learn in advance.
    """
    try:
        from airflow.utils.file import list_py_file_paths

        return [p for root in _local_roots() for p in list_py_file_paths(root) if p.endswith(".py")]
    except Exception as exc:  # noqa: BLE001 - only a head start for preloading
        log.debug("no DAG files listed: %s", exc)
        return []


def _local_roots() -> list[str]:
    try:
        import airflow.dag_processing.bundles.local  # noqa: F401 - only Airflow 3 has bundles
    except ImportError:  # Airflow 2: one DAGs folder
        from airflow.configuration import conf

        return [conf.get("core", "dags_folder", fallback="") or ""]
    return list(dict.fromkeys(local_bundles().values()))
