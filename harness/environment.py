"""A sandbox's environment: its home layout, ports, metadata database URL, and the variables that
configure every Airflow process it starts.

All Airflow configuration goes through environment variables of the child processes; the caller's
own ``AIRFLOW*`` variables are dropped, so nothing leaks in from a deployment the caller may have.
The secrets (fernet key, API secret key, JWT secret) are fresh per sandbox and live only in that
environment and in the 0600 ``sandbox.env`` file of the home, never on a command line.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import async_local_executor
from harness.postgres import PostgresDatabase

__all__ = [
    "AIRFLOW_CFG_KINDS",
    "DEFAULT_DAGS_FOLDER",
    "DEMO_CALLBACK_DIR_ENV",
    "SANDBOX_MARKER_ENV",
    "HomeLayout",
    "airflow_env",
    "choose_database",
    "free_port",
    "installed_airflow_major",
    "local_url",
    "prepare_home",
]

# The example DAGs ship with the package (an operator can run the demo DAG from the wheel).
DEFAULT_DAGS_FOLDER: Final[Path] = Path(async_local_executor.__file__).resolve().parent / "example_dags"
# Every child gets this variable; stop() uses it to find processes that left our process
# groups (the task supervisor puts each task into a process group of its own).
SANDBOX_MARKER_ENV: Final[str] = "AIRFLOW_SANDBOX_ID"
# The demo DAG's deadline callback writes its marker file here (see example_dags/demo_dag.py).
DEMO_CALLBACK_DIR_ENV: Final[str] = "ALE_DEMO_CALLBACK_DIR"
# What the home's airflow.cfg is. "generated": none is written beforehand, so Airflow's first command
# writes its own (every option with its default, [workers] execution_api_timeout = 5.0 among them, and
# the environment's values), as on a real deployment: the default. "empty": an empty file, so every
# option not in the environment is unset; an explicit variant, never what operators run.
AIRFLOW_CFG_KINDS: Final[tuple[str, ...]] = ("generated", "empty")
_SIMPLE_AUTH_MANAGER: Final[str] = (
    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
)


def installed_airflow_major() -> int:
    """The major version of the Airflow installed beside this package, without importing it."""
    from importlib.metadata import version

    return int(version("apache-airflow").split(".", 1)[0])


def free_port(host: str = "127.0.0.1") -> int:
    """Return a currently free TCP port on ``host`` (racy by nature, good enough for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


@dataclass(frozen=True)
class HomeLayout:
    """Where things live in a sandbox's ``AIRFLOW_HOME``."""

    root: Path

    @property
    def logs(self) -> Path:
        """``[logging] base_log_folder``: task logs and executor callback logs live here."""
        return self.root / "logs"

    @property
    def proc_logs(self) -> Path:
        """stdout+stderr of the processes the sandbox starts, one file each."""
        return self.root / "logs-procs"

    def process_log(self, name: str) -> Path:
        return self.proc_logs / f"{name}.log"

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> Path:
        """Local log file of one try, per the default 3.x ``[logging] log_filename_template``."""
        path = self.logs / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            path = path / f"map_index={map_index}"
        return path / f"attempt={try_number}.log"

    def callback_log(self, dag_id: str, run_id: str, callback_id: str) -> Path:
        """Log file of an executor callback (``ExecuteCallback.log_path``)."""
        return self.logs / "executor_callbacks" / dag_id / run_id / callback_id


def choose_database(database: str, home: Path) -> tuple[str, PostgresDatabase | None]:
    """The SQLAlchemy URL for ``database``, and the PostgreSQL database to create when it is new.

    ``"sqlite"``: a file in the home; ``"postgres"``: a fresh database on 127.0.0.1:5432 (created by
    the caller, at start); anything with ``://``: the URL of an existing (empty) database.
    """
    if database == "sqlite":
        return f"sqlite:///{home / 'airflow.db'}", None
    if database in ("postgres", "postgresql"):
        postgres = PostgresDatabase()
        return postgres.url, postgres
    if "://" in database:
        return database, None
    raise ValueError(f"unsupported database: {database!r}")


def airflow_env(
    *,
    home: HomeLayout,
    bin_dir: Path,
    marker: str,
    executor: str,
    dags_folder: Path,
    parallelism: int,
    sql_alchemy_conn: str,
    api_port: int,
    log_server_port: int,
    execution_api_timeout: float | None,
) -> dict[str, str]:
    """The environment of every Airflow process of one sandbox, from this process's own."""
    # Inherited Airflow settings would leak the caller's deployment into the sandbox.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AIRFLOW") and k not in (DEMO_CALLBACK_DIR_ENV, "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    # Nothing checks VIRTUAL_ENV for correctness, but tools spawned by tasks look at it.
    if (bin_dir.parent / "pyvenv.cfg").exists():
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    api_url = local_url(api_port)
    fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    env.update(
        {
            SANDBOX_MARKER_ENV: marker,
            "PYTHONUNBUFFERED": "1",
            # A process that ignores SIGTERM gets SIGABRT before SIGKILL (see Processes.terminate_all):
            # faulthandler then writes every thread's stack to its log, so a hang says where.
            "PYTHONFAULTHANDLER": "1",
            "AIRFLOW_HOME": str(home.root),
            # Airflow writes its airflow.cfg here on the first command (airflow db migrate), every
            # option with its default, as on a deployment's first start (see AIRFLOW_CFG_KINDS).
            "AIRFLOW_CONFIG": str(home.root / "airflow.cfg"),
            "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            # Otherwise the per-run default of 16 caps a 24-way map before parallelism does.
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(parallelism),
            "AIRFLOW__CORE__FERNET_KEY": fernet_key,
            "AIRFLOW__CORE__AUTH_MANAGER": _SIMPLE_AUTH_MANAGER,
            # Makes every request an admin request: no login, no token handling in tests.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                home.root / "simple_auth_manager_passwords.json"
            ),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": api_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # Shared by api-server (verifies) and scheduler (signs task workload tokens).
            # 64+ bytes: PyJWT warns about shorter HMAC-SHA512 keys.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home.logs),
            # The scheduler serves logs on 8793 by default; two sandboxes would collide.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_server_port),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            # Airflow's default: a file is parsed when found and then every 30 s. Parsing every file of
            # the DAGs folder more often costs each idle deployment CPU that the suite's others need.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
            # The default lives in the system temp dir and is shared by every deployment.
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(home.root / "dag_bundles"),
            DEMO_CALLBACK_DIR_ENV: str(home.root / "deadline_callbacks"),
        }
    )
    if execution_api_timeout is not None:
        # An operator's explicit choice, as a variant: by default the option keeps what Airflow
        # writes into airflow.cfg (5 s), as in a deployment nobody tuned.
        env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] = f"{execution_api_timeout:g}"
    return env


def simple_auth_users(users: Mapping[str, str]) -> dict[str, str]:
    """The configuration that makes the simple auth manager ask for a login, for these users (name -> role)."""
    return {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
            f"{name}:{role}" for name, role in users.items()
        ),
    }


def write_passwords(env: Mapping[str, str], passwords: Mapping[str, str]) -> None:
    """The simple auth manager's password file (0600), written before it starts: it keeps what it finds."""
    path = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(dict(passwords), file)


def prepare_home(home: HomeLayout, env: Mapping[str, str], callback_dir: Path, airflow_cfg: str) -> None:
    """Create the home's directories and ``sandbox.env`` (0600), and an empty ``airflow.cfg`` if asked.

    :param airflow_cfg: one of :data:`AIRFLOW_CFG_KINDS`; ``"generated"`` leaves the file to Airflow
    """
    home.root.mkdir(parents=True, exist_ok=True)
    home.proc_logs.mkdir(exist_ok=True)
    home.logs.mkdir(exist_ok=True)
    callback_dir.mkdir(exist_ok=True)
    if airflow_cfg == "empty":
        # An existing file, even empty, stops Airflow from writing its own.
        (home.root / "airflow.cfg").touch(mode=0o600, exist_ok=True)
    # Handy for `set -a; . sandbox.env` when debugging a kept home; holds secrets, so 0600.
    env_file = home.root / "sandbox.env"
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        # O_CREAT's mode does not apply to a file a reused home already has.
        os.fchmod(fh.fileno(), 0o600)
        for key, value in sorted(env.items()):
            if key.startswith("AIRFLOW") or key == DEMO_CALLBACK_DIR_ENV:
                fh.write(f"{key}={_shell_quote(value)}\n")


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"
