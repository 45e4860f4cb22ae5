"""The provider registration, seen through a real ``airflow`` CLI in a fresh AIRFLOW_HOME.

The entry point comes from this package's installed metadata (``pip install -e .``), as it would
from a wheel: nothing here registers it by hand.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import airflow
import jsonschema
import pytest

from async_local_executor import __version__
from async_local_executor.adapter.config import OPTIONS, SECTION, ExecutorConfig
from async_local_executor.adapter.provider import EXECUTOR, configuration_reference, get_provider_info

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


@pytest.fixture
def airflow_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "home")

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AIRFLOW, *args],
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return run


def test_the_entry_point_is_installed_and_names_get_provider_info() -> None:
    [entry] = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("async_local")]
    assert entry.load() is get_provider_info


def test_provider_info_is_valid_for_airflow_and_describes_every_option_fully() -> None:
    info = get_provider_info()
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["package-name"] == "async-local-executor"
    assert info["versions"] == [__version__]
    assert info["executors"] == [EXECUTOR]
    options = info["config"][SECTION]["options"]
    assert list(options) == [o.name for o in OPTIONS]
    for name, option in options.items():
        assert set(option) == {"description", "type", "default", "example", "version_added"}, name
        assert option["description"], name
        assert option["example"], name
        assert option["version_added"], name


def test_the_defaults_airflow_gets_are_the_executors_own_and_every_example_parses() -> None:
    options = get_provider_info()["config"][SECTION]["options"]
    defaults = {name: option["default"] for name, option in options.items()}
    examples = {name: option["example"] for name, option in options.items()}

    def source(values: dict[str, str]) -> object:
        class Conf:
            def get(self, section: str, key: str, fallback: str = "") -> str:
                assert section == SECTION
                return values[key]

        return Conf()

    assert ExecutorConfig.from_conf(source(defaults)) == ExecutorConfig()  # type: ignore[arg-type]
    assert ExecutorConfig.from_conf(source(examples)) != ExecutorConfig()  # type: ignore[arg-type]


def test_the_configuration_reference_is_generated_from_the_provider_info() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == configuration_reference(), "run `make docs` and commit docs/configuration.md"


def test_airflow_lists_the_provider_and_its_options_with_defaults(
    airflow_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    providers = airflow_cli("providers", "list", "--output", "json")
    assert providers.returncode == 0, providers.stderr
    [ours] = [p for p in json.loads(providers.stdout) if p["package_name"] == "async-local-executor"]
    assert ours["version"] == __version__

    listed = airflow_cli("config", "list", "--section", SECTION, "--show-values", "--include-descriptions")
    assert listed.returncode == 0, listed.stderr
    for option in OPTIONS:
        assert f"\n{option.name} = {option.default}\n" in listed.stdout, option.name
        assert option.description.split(" (")[0][:40] in listed.stdout, option.name

    overridden = airflow_cli(
        "config",
        "get-value",
        SECTION,
        "shutdown_timeout",
        AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT="7",
    )
    assert overridden.stdout.strip() == "7", overridden.stderr


def test_airflow_loads_the_status_command_from_the_provider(
    airflow_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    empty = tmp_path / "state"
    empty.mkdir()
    checked = airflow_cli("async-local-executor", "status", "--check", "--state-dir", str(empty))
    assert checked.returncode == 2, checked.stderr
    assert "no executor status found" in checked.stdout
    # No executor without a provider "cli" section: Airflow would warn and fall back to importing executors.
    assert "missing 'cli' section" not in checked.stderr


def offered_options(help_text: str) -> dict[str, str]:
    """Each option a ``--help`` lists (its flags and metavar) with its help, however the lines wrap."""
    section = re.split(r"^options:$", help_text, maxsplit=1, flags=re.MULTILINE | re.IGNORECASE)[1]
    options = {}
    for entry in re.split(r"\n  (?=-)", section)[1:]:
        flags, *text = re.split(r" {2,}|\n", entry.strip(), maxsplit=1)
        options[flags] = " ".join("".join(text).split())
    return options


def test_both_status_commands_offer_the_same_options_with_the_same_help(
    airflow_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    wide = {"COLUMNS": "200", "NO_COLOR": "1"}
    ours = subprocess.run(
        [sys.executable, "-m", "async_local_executor.ops.cli", "status", "--help"],
        env={**os.environ, **wide},
        capture_output=True,
        text=True,
        check=True,
    )
    airflows = airflow_cli("async-local-executor", "status", "--help", **wide)
    assert airflows.returncode == 0, airflows.stderr

    offered = offered_options(ours.stdout)
    assert offered == offered_options(airflows.stdout)
    assert set(offered) == {"-h, --help", "--json", "--watch SECONDS", "--check", "--state-dir STATE_DIR"}
    assert (
        offered["--state-dir STATE_DIR"]
        == "default: the state_dir option of the async_local_executor section"
    )
