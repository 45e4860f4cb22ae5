"""The layers: each imports only the layers below it, and the core knows nothing of Airflow.

From the bottom: ``core`` (process supervision, no Airflow), ``ops`` (state directory, journal, status,
the ``status`` command; Airflow only for its configuration), ``adapter`` (the executor Airflow loads),
``plugin`` (the executor page). Two checks, because each misses what the other sees: importing every
core module in a fresh interpreter where ``airflow`` cannot be imported catches what runs at import
time (and anything that drags an upper layer in); reading every module's source catches imports
deferred into functions, which run only on some path a test may never take.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import async_local_executor
from async_local_executor import core

PACKAGE = Path(async_local_executor.__file__).parent
CORE = Path(core.__file__).parent
UPPER = ("async_local_executor.ops", "async_local_executor.adapter", "async_local_executor.plugin")
# What each layer may not import, its deferred imports included. The test harness is never a dependency.
FORBIDDEN = {
    "core": ("airflow", "sqlalchemy", "harness", *UPPER),
    # The ``status`` command finds the state directory the way the executor does: from Airflow's
    # configuration, and from nothing else of Airflow.
    "ops": ("airflow.models", "airflow.executors", "airflow.sdk", "sqlalchemy", "harness", *UPPER[1:]),
    "adapter": ("harness", "async_local_executor.plugin"),
    "plugin": ("harness",),
}

BLOCKED_IMPORT = """
import importlib, importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"the core imported {name}")
        return None

sys.meta_path.insert(0, Block())
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("async_local_executor.adapter", "async_local_executor.ops")))))
"""


def core_modules() -> list[str]:
    found = [info.name for info in pkgutil.walk_packages([str(CORE)], prefix="async_local_executor.core.")]
    return ["async_local_executor.core", *found]


def imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
        ):
            names.append(node.args[0].value)
    return names


def test_every_core_module_is_found() -> None:
    # A walk that found nothing would make the checks below pass vacuously.
    modules = core_modules()
    assert "async_local_executor.core.supervisor" in modules
    assert "async_local_executor.core.launchers.base" in modules
    assert len(modules) == len(list(CORE.rglob("*.py")))


def import_blocked(modules: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, json.dumps(modules)],
        check=False,
        capture_output=True,
        text=True,
    )


def test_every_core_module_imports_with_airflow_blocked() -> None:
    result = import_blocked(core_modules())
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [], "the core pulled in the adapter or the operations layer"


def forbidden(name: str, layer: str) -> bool:
    return any(name == f or name.startswith(f"{f}.") for f in FORBIDDEN[layer])


def test_every_module_belongs_to_a_layer() -> None:
    # Beside the layers, only the package's own entry points: the class paths users configure
    # (``__init__``, ``executor``), the example DAG, and the older module paths still kept.
    outside = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in FORBIDDEN
    }
    assert outside <= {
        "__init__.py",
        "executor.py",
        "example_dags/demo_dag.py",
    }


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_module_imports_a_layer_above_its_own_even_lazily(layer: str) -> None:
    root = PACKAGE / layer
    modules = sorted(root.rglob("*.py"))
    assert modules, f"no module found under {root}"
    offenders = {
        str(path.relative_to(PACKAGE)): name
        for path in modules
        for name in imported_names(ast.parse(path.read_text(), str(path)))
        if forbidden(name, layer)
    }
    assert offenders == {}


def test_the_blocker_stops_a_module_that_imports_airflow() -> None:
    result = import_blocked(["async_local_executor.adapter.compat"])
    assert result.returncode != 0
    assert "the core imported airflow" in result.stderr


def test_the_rules_catch_an_upper_layer_and_let_a_lower_one_pass() -> None:
    assert forbidden("async_local_executor.adapter.executor", "ops")
    assert forbidden("airflow.models.taskinstance", "core")
    assert not forbidden("airflow.configuration", "ops")
    assert not forbidden("async_local_executor.core.supervisor", "adapter")


def test_the_source_check_sees_a_deferred_import() -> None:
    deferred = ast.parse(
        "def f():\n    from airflow.models import DAG\n    import importlib\n    importlib.import_module('airflow.settings')\n"
    )
    assert imported_names(deferred) == ["airflow.models", "importlib", "airflow.settings"]
