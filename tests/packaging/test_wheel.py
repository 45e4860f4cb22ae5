"""What an operator installs: the wheel holds the executor and nothing of the development harness.

The wheel is built from a copy of the package sources with pip (build isolation fetches the build
backend pyproject.toml names, as any installer would).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "async_local_executor"
# Paths configurations, running schedulers and old journals may name (see the modules' docstrings).
OLD_PATHS = ("executor.py",)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)],
        check=True,
    )
    [built] = out.glob("async_local_executor-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def package_files(archive: zipfile.ZipFile) -> set[str]:
    return {name for name in archive.namelist() if ".dist-info/" not in name}


def test_the_wheel_holds_the_package_sources_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    expected = {
        f"async_local_executor/{path.relative_to(PACKAGE).as_posix()}"
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert package_files(wheel) == expected


def test_no_harness_demo_or_test_code_is_shipped(wheel: zipfile.ZipFile) -> None:
    names = package_files(wheel)
    assert {name.split("/", 1)[0] for name in names} == {"async_local_executor"}
    modules = {Path(name).name for name in names}
    assert not {"sandbox.py", "sandbox_airflow2.py", "demo.py", "conftest.py"} & modules
    assert not [name for name in modules if name.startswith("test_")]
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    # The harness reads the metadata database with SQLAlchemy; the executor itself does not.
    assert not [line for line in required if "sqlalchemy" in line.lower() and "extra ==" not in line]


def test_the_entry_points_name_modules_the_wheel_holds(wheel: zipfile.ZipFile) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(
        wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    )
    targets = {
        "async-local-executor": entry_points["console_scripts"]["async-local-executor"],
        "provider_info": entry_points["apache_airflow_provider"]["provider_info"],
    }
    assert targets == {
        "async-local-executor": "async_local_executor.ops.cli:main",
        "provider_info": "async_local_executor.adapter.provider:get_provider_info",
    }
    names = package_files(wheel)
    for target in targets.values():
        assert target.split(":")[0].replace(".", "/") + ".py" in names


def test_old_module_paths_are_still_shipped(wheel: zipfile.ZipFile) -> None:
    names = package_files(wheel)
    assert {f"async_local_executor/{path}" for path in OLD_PATHS} <= names
    assert "async_local_executor/example_dags/demo_dag.py" in names
    assert "async_local_executor/py.typed" in names
