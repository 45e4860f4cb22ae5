"""Which execution-API client timeout task processes get (``compat.client_timeout``), read from an
airflow.cfg Airflow generated.

The file is written by Airflow's own CLI in a fresh home, as on a deployment's first start; each test
reads it (or an edited copy) with a parser of its own, as the scheduler reads its airflow.cfg.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.configuration import AirflowConfigParser

from async_local_executor.adapter.compat import SAFE_CLIENT_TIMEOUT, ClientTimeout, client_timeout

VARIABLE = "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"
DEFAULT_LINE = "execution_api_timeout = 5.0\n"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The text of the airflow.cfg Airflow writes in a home that has none."""
    home = tmp_path_factory.mktemp("generated-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home)
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run(
        [str(airflow), "config", "get-value", "core", "executor"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return (home / "airflow.cfg").read_text()


def chosen(tmp_path: Path, text: str | None, environ: dict[str, str]) -> ClientTimeout:
    conf = AirflowConfigParser()
    if text is not None:
        path = tmp_path / "airflow.cfg"
        path.write_text(text)
        conf.read(path)
    timeout = client_timeout(conf, environ)
    assert timeout is not None  # Airflow 3
    return timeout


@pytest.fixture(autouse=True)
def no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser reads the process environment; each test sets what it means to.
    monkeypatch.delenv(VARIABLE, raising=False)


def test_airflow_writes_its_default_timeout_into_the_file(generated: str) -> None:
    # What makes "present in airflow.cfg" mean nothing about the operator's choice.
    assert DEFAULT_LINE in generated


def test_the_generated_default_is_raised_for_task_processes(tmp_path: Path, generated: str) -> None:
    timeout = chosen(tmp_path, generated, {})
    assert timeout.env == {VARIABLE: "60"}
    assert timeout.seconds == SAFE_CLIENT_TIMEOUT
    assert timeout.describe().startswith("task processes get [workers] execution_api_timeout = 60s: ")
    assert "Airflow's default of 5s (in airflow.cfg as Airflow writes it)" in timeout.describe()


def test_an_unset_option_is_raised_too(tmp_path: Path) -> None:
    timeout = chosen(tmp_path, None, {})
    assert timeout.env == {VARIABLE: "60"}
    assert "Airflow's default of 5s (not set)" in timeout.describe()


def test_a_value_of_the_operators_own_in_airflow_cfg_is_kept(tmp_path: Path, generated: str) -> None:
    timeout = chosen(tmp_path, generated.replace(DEFAULT_LINE, "execution_api_timeout = 17\n"), {})
    assert timeout.env == {}
    assert timeout.seconds == 17.0
    assert (
        timeout.describe() == "task processes keep [workers] execution_api_timeout = 17s: set in airflow.cfg"
    )


def test_the_default_written_by_hand_cannot_be_told_from_airflow_s_and_is_raised(
    tmp_path: Path, generated: str
) -> None:
    timeout = chosen(tmp_path, generated.replace(DEFAULT_LINE, "execution_api_timeout = 5\n"), {})
    assert timeout.env == {VARIABLE: "60"}


def test_the_environment_is_an_explicit_choice_even_at_the_default(
    tmp_path: Path, generated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, "5")
    timeout = chosen(tmp_path, generated, dict(os.environ))
    assert timeout.env == {}
    assert timeout.seconds == 5.0
    assert timeout.describe() == (
        f"task processes keep [workers] execution_api_timeout = 5s: set in the environment ({VARIABLE})"
    )
