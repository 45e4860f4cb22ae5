"""Throwaway, real Airflow 3.3 deployment for demos, end-to-end tests and benchmarks.

``AirflowSandbox`` writes a fresh ``AIRFLOW_HOME``, migrates a fresh metadata database (SQLite
file or a newly created PostgreSQL database), starts ``api-server``, ``scheduler`` and
``dag-processor`` as separate process groups and offers helpers to trigger a DAG and inspect the
outcome. All Airflow configuration goes through environment variables of the child processes;
nothing is read from, or written to, the caller's own Airflow configuration.

Typical use::

    with AirflowSandbox(executor="async_local_executor.AsyncLocalExecutor") as sb:
        sb.wait_for_dag("async_local_executor_demo")
        run_id = sb.trigger("async_local_executor_demo")
        assert sb.wait_for_run("async_local_executor_demo", run_id, timeout=180) == "success"
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import async_local_executor

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DEFAULT_DAGS_FOLDER",
    "PROCESS_NAMES",
    "TERMINAL_CALLBACK_STATES",
    "TERMINAL_RUN_STATES",
    "AirflowSandbox",
    "CallbackRow",
    "PostgresDatabase",
    "SandboxError",
    "SandboxTimeout",
    "TaskInstanceRow",
    "free_port",
    "installed_airflow_major",
]

# The example DAGs ship with the package (an operator can run the demo DAG from the wheel).
DEFAULT_DAGS_FOLDER: Final[Path] = Path(async_local_executor.__file__).resolve().parent / "example_dags"
PROCESS_NAMES: Final[tuple[str, ...]] = ("api-server", "scheduler", "dag-processor")
TERMINAL_RUN_STATES: Final[frozenset[str]] = frozenset({"success", "failed"})
TERMINAL_CALLBACK_STATES: Final[frozenset[str]] = frozenset({"success", "failed"})
# Every child gets this variable; stop() uses it to find processes that left our process
# groups (the task supervisor puts each task into a process group of its own).
SANDBOX_MARKER_ENV: Final[str] = "AIRFLOW_SANDBOX_ID"
# The demo DAG's deadline callback writes its marker file here (see example_dags/demo_dag.py).
DEMO_CALLBACK_DIR_ENV: Final[str] = "ALE_DEMO_CALLBACK_DIR"
_SIMPLE_AUTH_MANAGER: Final[str] = (
    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
)

Progress = Callable[[str], None]


class SandboxError(RuntimeError):
    """Raised when the sandbox cannot start, a process dies, or a wait runs out of time."""


class SandboxTimeout(SandboxError):
    """A wait ran out of time (the processes were still alive)."""


@dataclass(frozen=True)
class TaskInstanceRow:
    task_id: str
    map_index: int
    state: str | None
    try_number: int
    start_date: datetime | None
    end_date: datetime | None
    queued_dttm: datetime | None
    duration: float | None


@dataclass(frozen=True)
class CallbackRow:
    """One row of the ``callback`` table, joined with its ``deadline`` row when there is one."""

    id: str
    type: str
    state: str | None
    fetch_method: str
    path: str | None
    output: str | None
    created_at: datetime | None
    data: dict[str, Any]
    deadline_time: datetime | None
    deadline_missed: bool | None


def _log(message: str) -> None:
    print(f"[sandbox] {message}", file=sys.stderr, flush=True)


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


def _as_datetime(value: object) -> datetime | None:
    # SQLite hands back text, PostgreSQL aware datetimes; Airflow stores UTC in both.
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = datetime.fromisoformat(value)
    else:
        raise SandboxError(f"unexpected datetime value {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _as_bool(value: object) -> bool | None:
    return None if value is None else bool(value)


def _unwrap_serialized(value: Any) -> Any:
    # ExtendedJSON columns hold BaseSerialization output: {"__type": ..., "__var": ...} wrappers.
    if isinstance(value, dict):
        if "__var" in value and "__type" in value:
            return _unwrap_serialized(value["__var"])
        return {str(k): _unwrap_serialized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_serialized(v) for v in value]
    return value


def _json_column(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    loaded = json.loads(value) if isinstance(value, (str, bytes)) else value
    unwrapped = _unwrap_serialized(loaded)
    return unwrapped if isinstance(unwrapped, dict) else {"value": unwrapped}


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"<{path} does not exist>"
    return "\n".join(text.splitlines()[-lines:])


def _live_pids(marker: str, pgids: Iterable[int]) -> list[int]:
    """Live (non-zombie) pids in one of ``pgids`` or carrying our marker env (Linux /proc only)."""
    needle = f"{SANDBOX_MARKER_ENV}={marker}".encode()
    groups = set(pgids)
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    own = os.getpid()
    found: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue  # a zombie holds no resources; its (re)parent reaps it
            if int(fields[2]) in groups or needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone already, or not ours to read
    return found


class PostgresDatabase:
    """A uniquely named PostgreSQL database that exists for the lifetime of the context."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 5432,
        user: str = "postgres",
        admin_databases: Sequence[str] = ("postgres", "test"),
        prefix: str = "airflow_sandbox",
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.admin_databases = tuple(admin_databases)
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self._created = False

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.name}"

    def _admin_url(self, dbname: str) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{dbname}"

    @contextlib.contextmanager
    def _admin_connection(self) -> Iterator[sa.Connection]:
        errors: list[str] = []
        for dbname in self.admin_databases:
            # AUTOCOMMIT: CREATE/DROP DATABASE cannot run inside a transaction block.
            engine = sa.create_engine(
                self._admin_url(dbname),
                poolclass=NullPool,
                isolation_level="AUTOCOMMIT",
                connect_args={"connect_timeout": 10},
            )
            try:
                conn = engine.connect()
            except sa.exc.OperationalError as exc:
                errors.append(f"{dbname}: {str(exc.orig).strip()}")
                engine.dispose()
                continue
            try:
                yield conn
            finally:
                conn.close()
                engine.dispose()
            return
        raise SandboxError(f"cannot connect to postgresql admin database: {'; '.join(errors)}")

    def create(self) -> str:
        with self._admin_connection() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self._created = True
        return self.url

    def drop(self) -> None:
        if not self._created:
            return
        with self._admin_connection() as conn:
            # A connection left over by a killed process would make DROP DATABASE fail.
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": self.name},
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self._created = False

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drop()


class AirflowSandbox:
    """A real, throwaway Airflow: fresh home, fresh database, api-server + scheduler + dag-processor.

    :param executor: executor class path or alias handed to ``[core] executor``.
    :param database: ``"sqlite"`` for a file in the home, ``"postgres"`` for a fresh database
        on 127.0.0.1:5432, or a SQLAlchemy URL of an existing (empty) database.
    :param dags_folder: folder with DAG files; defaults to the package's ``example_dags``.
    :param parallelism: ``[core] parallelism`` and ``[core] max_active_tasks_per_dag``.
    :param extra_config: environment variables applied last (may override anything).
    :param extra_processes: more long-running Airflow processes, name -> ``airflow`` CLI arguments
        (e.g. ``{"celery-worker": ("celery", "worker")}``): same environment, own process group and
        log file under ``proc_logs_dir``, started after the three above and stopped before the
        api-server by ``stop()``.
    :param home: ``AIRFLOW_HOME``; default a fresh temporary directory.
    :param python: python executable of the virtualenv that runs Airflow; its directory must
        hold the ``airflow`` script. Defaults to ``sys.executable``.
    :param keep_home: keep the home directory after ``stop()``; it is always kept when the
        context exits with an exception, so the logs can be read.
    :param startup_timeout: bound for each readiness wait during ``start()``.
    :param stop_timeout: how long ``stop()`` waits for each process after SIGTERM before it sends
        SIGABRT (a traceback of every thread, with ``PYTHONFAULTHANDLER``) and then SIGKILL.
    :param execution_api_timeout: ``[workers] execution_api_timeout``, the task SDK's timeout for its
        calls to the api-server, in seconds; None leaves the option unset, so Airflow's own default
        (5 s) applies.
    :param progress: called with one line per startup/shutdown step; default prints to stderr.
    """

    # The long-running processes a deployment of this Airflow consists of, started in this order.
    process_names: tuple[str, ...] = PROCESS_NAMES

    def __init__(
        self,
        *,
        executor: str = "LocalExecutor",
        database: str = "sqlite",
        dags_folder: str | os.PathLike[str] = DEFAULT_DAGS_FOLDER,
        parallelism: int = 8,
        extra_config: Mapping[str, str] | None = None,
        extra_processes: Mapping[str, Sequence[str]] | None = None,
        home: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        keep_home: bool = False,
        startup_timeout: float = 180.0,
        stop_timeout: float = 30.0,
        execution_api_timeout: float | None = 60.0,
        progress: Progress | None = _log,
    ) -> None:
        if parallelism < 1:
            raise ValueError("parallelism must be >= 1")
        if execution_api_timeout is not None and execution_api_timeout <= 0:
            raise ValueError("execution_api_timeout must be > 0 or None")
        self.execution_api_timeout = execution_api_timeout
        self.executor = executor
        self.parallelism = parallelism
        self.dags_folder = Path(dags_folder).resolve()
        if not self.dags_folder.is_dir():
            raise ValueError(f"dags folder not found: {self.dags_folder}")
        self.python = Path(python) if python is not None else Path(sys.executable)
        self.bin_dir = self.python.parent
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.keep_home = keep_home
        self._progress = progress
        self._owns_home = home is None
        self.home = (
            Path(home).resolve() if home is not None else Path(tempfile.mkdtemp(prefix="airflow-sandbox-"))
        )
        self.marker = uuid.uuid4().hex
        self.api_port = free_port()
        self.log_server_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"

        self._postgres: PostgresDatabase | None = None
        if database == "sqlite":
            self.sql_alchemy_conn = f"sqlite:///{self.home / 'airflow.db'}"
        elif database in ("postgres", "postgresql"):
            self._postgres = PostgresDatabase()
            self.sql_alchemy_conn = self._postgres.url
        elif "://" in database:
            self.sql_alchemy_conn = database
        else:
            raise ValueError(f"unsupported database: {database!r}")

        self._extra_config = dict(extra_config or {})
        self.extra_processes = {name: tuple(args) for name, args in (extra_processes or {}).items()}
        for name in self.extra_processes:
            if name in ("db-migrate", *PROCESS_NAMES) or not name or "/" in name:
                raise ValueError(f"invalid extra process name: {name!r}")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_handles: list[Any] = []
        self._pgids: set[int] = set()
        self._engine: sa.Engine | None = None
        self._started = False
        self._env = self._build_env()

    # ------------------------------------------------------------------ configuration

    @property
    def env(self) -> dict[str, str]:
        """A copy of the full environment given to every Airflow process of this sandbox."""
        return dict(self._env)

    @property
    def logs_dir(self) -> Path:
        """``[logging] base_log_folder``: task logs and executor callback logs live here."""
        return self.home / "logs"

    @property
    def proc_logs_dir(self) -> Path:
        return self.home / "logs-procs"

    @property
    def process_logs(self) -> dict[str, Path]:
        """stdout+stderr file of each long-running process, plus ``db-migrate``."""
        names = ("db-migrate", *self.process_names, *self.extra_processes)
        return {name: self.proc_logs_dir / f"{name}.log" for name in names}

    @property
    def callback_dir(self) -> Path:
        """Where the demo DAG's deadline callback writes ``<run_id>.json``."""
        return Path(self._env[DEMO_CALLBACK_DIR_ENV])

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs.items()}

    def _build_env(self) -> dict[str, str]:
        # Inherited Airflow settings would leak the caller's deployment into the sandbox.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AIRFLOW") and k not in (DEMO_CALLBACK_DIR_ENV, "VIRTUAL_ENV")
        }
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", "")])
        # Nothing checks VIRTUAL_ENV for correctness, but tools spawned by tasks look at it.
        if (self.bin_dir.parent / "pyvenv.cfg").exists():
            env["VIRTUAL_ENV"] = str(self.bin_dir.parent)
        fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        env.update(
            {
                SANDBOX_MARKER_ENV: self.marker,
                "PYTHONUNBUFFERED": "1",
                # A process that ignores SIGTERM gets SIGABRT before SIGKILL (see _terminate_all):
                # faulthandler then writes every thread's stack to its log, so a hang says where.
                "PYTHONFAULTHANDLER": "1",
                "AIRFLOW_HOME": str(self.home),
                # An existing (empty) file stops Airflow from writing a default airflow.cfg.
                "AIRFLOW_CONFIG": str(self.home / "airflow.cfg"),
                "AIRFLOW__CORE__EXECUTOR": self.executor,
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
                # Otherwise the per-run default of 16 caps a 24-way map before parallelism does.
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(self.parallelism),
                "AIRFLOW__CORE__FERNET_KEY": fernet_key,
                "AIRFLOW__CORE__AUTH_MANAGER": _SIMPLE_AUTH_MANAGER,
                # Makes every request an admin request: no login, no token handling in tests.
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                    self.home / "simple_auth_manager_passwords.json"
                ),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__BASE_URL": self.api_url,
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
                # Shared by api-server (verifies) and scheduler (signs task workload tokens).
                # 64+ bytes: PyJWT warns about shorter HMAC-SHA512 keys.
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir),
                # The scheduler serves logs on 8793 by default; two sandboxes would collide.
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_server_port),
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
                # The default lives in the system temp dir and is shared by every deployment.
                "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.home / "dag_bundles"),
                DEMO_CALLBACK_DIR_ENV: str(self.home / "deadline_callbacks"),
            }
        )
        if self.execution_api_timeout is not None:
            # With one api-server worker on 2 cores, a burst of task starts can queue a request past
            # the 5 s default client timeout; the task SDK then retries calls that are not
            # idempotent in Airflow 3.3.2 (a late duplicate PATCH .../run puts a finished task back
            # to running, a retried connection-test GET gets 409). Same setting for every executor.
            env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] = f"{self.execution_api_timeout:g}"
        env.update(self._extra_config)
        return env

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(keep_home=self.keep_home or exc_type is not None)

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    @contextlib.contextmanager
    def _step(self, what: str) -> Iterator[None]:
        self._say(f"{what} ...")
        started = time.monotonic()
        yield
        self._say(f"{what} done in {time.monotonic() - started:.1f}s")

    def start(self) -> None:
        """Create home and database, migrate, start the processes and wait until they serve."""
        if self._started:
            raise SandboxError("sandbox already started")
        self._started = True
        try:
            self._say(f"home {self.home}, executor {self.executor}, api {self.api_url}")
            self._prepare_home()
            if self._postgres is not None:
                with self._step(f"creating postgresql database {self._postgres.name}"):
                    self._postgres.create()
            with self._step("airflow db migrate"):
                self._migrate()
            for name in (*self.process_names, *self.extra_processes):
                with self._step(f"starting {name}"):
                    self._spawn(name)
            with self._step(f"waiting for {', '.join(self.process_names)} to be healthy"):
                self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop(keep_home=True)
            raise

    def _prepare_home(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.proc_logs_dir.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.callback_dir.mkdir(exist_ok=True)
        cfg = self.home / "airflow.cfg"
        cfg.touch(mode=0o600, exist_ok=True)
        # Handy for `set -a; . sandbox.env` when debugging a kept home; holds secrets, so 0600.
        env_file = self.home / "sandbox.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            for key, value in sorted(self._env.items()):
                if key.startswith("AIRFLOW") or key == DEMO_CALLBACK_DIR_ENV:
                    fh.write(f"{key}={_shell_quote(value)}\n")

    def _airflow_argv(self, args: Sequence[str]) -> list[str]:
        script = self.bin_dir / "airflow"
        if script.exists():
            return [str(script), *args]
        return [str(self.python), "-m", "airflow", *args]

    def _migrate(self) -> None:
        log_path = self.process_logs["db-migrate"]
        with log_path.open("wb") as out:
            try:
                result = subprocess.run(
                    self._airflow_argv(["db", "migrate"]),
                    env=self._env,
                    cwd=self.home,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.startup_timeout * 2,
                    start_new_session=True,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise SandboxError(f"airflow db migrate timed out; log tail:\n{_tail(log_path)}") from exc
        if result.returncode != 0:
            raise SandboxError(
                f"airflow db migrate failed with exit code {result.returncode}; log tail:\n{_tail(log_path)}"
            )

    def _spawn(self, name: str) -> None:
        log_path = self.process_logs[name]
        handle = log_path.open("ab")
        self._log_handles.append(handle)
        proc = subprocess.Popen(
            self._airflow_argv(self.extra_processes.get(name, (name,))),
            env=self._env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            # Own process group: stop() can signal the process and all its workers at once.
            start_new_session=True,
        )
        self._procs[name] = proc
        self._pgids.add(proc.pid)

    def kill(self, name: str) -> int:
        """SIGKILL one Airflow process (not its group): a crash, as the kernel's OOM killer does it.

        :return: the pid it had
        """
        proc = self._procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(self.stop_timeout)
        return proc.pid

    def signal_and_wait(self, name: str, sig: signal.Signals, timeout: float) -> int:
        """Send ``sig`` to one Airflow process (not its group), as Kubernetes does, and wait for its exit.

        :return: its exit status
        :raises SandboxError: if it is still running after ``timeout`` seconds
        """
        proc = self._procs[name]
        os.kill(proc.pid, sig)
        if not _wait_exit(proc, timeout):
            raise SandboxError(f"{name} still running {timeout:.0f}s after {sig.name}")
        return int(proc.returncode)

    def restart(self, name: str) -> None:
        """Start a process of this kind again (after :meth:`kill`)."""
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            raise SandboxError(f"{name} is still running (pid {proc.pid})")
        self._spawn(name)

    def reconfigure(self, values: Mapping[str, str]) -> None:
        """Change configuration (``AIRFLOW__...`` variables) for the processes started from now on.

        What editing airflow.cfg is to a deployment: running processes keep what they read.
        """
        self._env.update(values)

    def live_pids(self) -> list[int]:
        """Every live process this sandbox started, directly or not (task processes included)."""
        return _live_pids(self.marker, self._pgids)

    def stop(self, *, keep_home: bool | None = None) -> None:
        """Stop every process (SIGTERM, bounded wait, SIGKILL), drop the database, clean up.

        Safe to call more than once and after a failed ``start()``.
        """
        keep = self.keep_home if keep_home is None else keep_home
        if self._procs:
            with self._step("stopping airflow processes"):
                self._terminate_all()
        self._kill_leftovers()
        for handle in self._log_handles:
            handle.close()
        self._log_handles.clear()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._postgres is not None:
            try:
                self._postgres.drop()
            except Exception as exc:  # noqa: BLE001 - cleanup must go on; say what failed
                self._say(f"could not drop database {self._postgres.name}: {exc}")
        if self._owns_home and not keep and self.home.exists():
            shutil.rmtree(self.home, ignore_errors=True)
        elif self.home.exists():
            self._say(f"kept home {self.home}")

    def _kill_leftovers(self) -> None:
        # Task processes run in process groups of their own, so killpg on our groups misses
        # them; the marker env var finds them. A SIGKILLed process also needs a moment to go.
        deadline = time.monotonic() + 10.0
        killed: set[int] = set()
        while pids := _live_pids(self.marker, self._pgids):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(pids)
            if time.monotonic() >= deadline:
                self._say(f"processes still alive after SIGKILL: {pids}")
                break
            time.sleep(0.1)
        if killed:
            self._say(f"killed {len(killed)} leftover process(es): {sorted(killed)}")

    def _terminate_all(self) -> None:
        # One at a time, scheduler first: its executor waits for running tasks on shutdown, and those
        # still need the api-server to report their final state. Stopping everything at once made
        # tasks retry against a dead api-server until the scheduler was SIGKILLed.
        # Extra processes (a Celery worker) go before the api-server for the same reason.
        order: list[str] = [n for n in ("scheduler", "dag-processor") if n in self._procs]
        order += [name for name in self._procs if name not in (*order, "api-server")]
        order += [n for n in ("api-server",) if n in self._procs]
        procs = [(name, self._procs[name]) for name in order]
        for name, proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            # Each its own bound: a slow scheduler must not eat the api-server's time to stop.
            if not _wait_exit(proc, self.stop_timeout):
                self._say(
                    f"{name} ignored SIGTERM for {self.stop_timeout:.0f}s; sending SIGABRT (its threads' "
                    f"stacks go to {self.process_logs[name]}), then SIGKILL"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGABRT)
                _wait_exit(proc, 5.0)
        for _, proc in procs:
            # Also reaps group members (executor workers, uvicorn) that outlived their leader.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait_exit(proc, 5.0)
        self._procs.clear()

    # ------------------------------------------------------------------ processes and CLI

    def log_tail(self, name: str, lines: int = 60) -> str:
        return _tail(self.process_logs[name], lines)

    def check_processes(self) -> None:
        """Raise if one of the long-running processes has exited."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                raise SandboxError(f"{name} exited with code {code}; log tail:\n{self.log_tail(name)}")

    def airflow(
        self, *args: str, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command with the sandbox environment and capture its output."""
        result = subprocess.run(
            self._airflow_argv(args),
            env=self._env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise SandboxError(
                f"airflow {' '.join(args)} failed with exit code {result.returncode}:\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def _wait(
        self,
        what: str,
        probe: Callable[[], bool],
        timeout: float,
        log_name: str,
        interval: float = 0.25,
        detail: Callable[[], str] | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_processes()
            if probe():
                return
            if time.monotonic() >= deadline:
                extra = f"\n{detail()}" if detail is not None else ""
                raise SandboxTimeout(
                    f"timed out after {timeout:.0f}s waiting for {what}{extra}\n"
                    f"{log_name} log tail:\n{self.log_tail(log_name)}"
                )
            time.sleep(interval)

    # ------------------------------------------------------------------ REST API

    def api(self, method: str, path: str, body: object | None = None, timeout: float = 30.0) -> Any:
        """Call the public REST API (``path`` relative to ``/api/v2``) and return decoded JSON."""
        data = None if body is None else json.dumps(body).encode()
        # The URL is always our own http://127.0.0.1 api-server, never caller-supplied.
        request = urllib.request.Request(  # noqa: S310
            f"{self.api_url}/api/v2/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise SandboxError(f"{method} {path} failed with http {exc.code}: {detail}") from exc
        return json.loads(payload) if payload else None

    def health(self) -> dict[str, Any] | None:
        """The ``/api/v2/monitor/health`` document, or None while the api-server is not up."""
        try:
            result = self.api("GET", "monitor/health", timeout=5.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, SandboxError):
            return None
        return result if isinstance(result, dict) else None

    def wait_healthy(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the api-server answers and reports scheduler and dag-processor healthy."""
        last: dict[str, Any] | None = None

        def probe() -> bool:
            nonlocal last
            last = self.health()
            if last is None:
                return False
            return all(
                (last.get(part) or {}).get("status") == "healthy"
                for part in ("metadatabase", "scheduler", "dag_processor")
            )

        def which_log() -> str:
            if last is None:
                return "api-server"
            if (last.get("scheduler") or {}).get("status") != "healthy":
                return "scheduler"
            return "dag-processor"

        try:
            self._wait("a healthy deployment", probe, timeout, "api-server", interval=0.5)
        except SandboxTimeout:
            name = which_log()
            raise SandboxTimeout(
                f"timed out after {timeout:.0f}s waiting for a healthy deployment; "
                f"last health: {json.dumps(last)}\n{name} log tail:\n{self.log_tail(name)}"
            ) from None
        assert last is not None
        return last

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"dags/{_q(dag_id)}", {"is_paused": False})

    def trigger(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        unpause: bool = True,
    ) -> str:
        """Unpause ``dag_id`` and create a manual run; return its run_id."""
        if unpause:
            self.unpause(dag_id)
        # Our own run_id keeps log paths free of ':' and '+', unlike the default manual__<iso>.
        run_id = run_id or f"sandbox__{time.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:8]}"
        return self._create_run(dag_id, run_id, dict(conf or {}))

    def _create_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        result = self.api("POST", f"dags/{_q(dag_id)}/dagRuns", body)
        return str(result["dag_run_id"])

    def clear(self, dag_id: str, run_id: str, task_id: str, map_indexes: Sequence[int]) -> None:
        """Clear some mapped task instances of a run (they run again), as the UI's Clear does."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "only_failed": False,
            "reset_dag_runs": True,
            "task_ids": [[task_id, i] for i in map_indexes],
        }
        self.api("POST", f"dags/{_q(dag_id)}/clearTaskInstances", body)

    def xcom(
        self, dag_id: str, run_id: str, task_id: str, *, key: str = "return_value", map_index: int = -1
    ) -> Any:
        """Deserialized XCom value via the REST API."""
        path = (
            f"dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}/xcomEntries/{_q(key)}"
            f"?map_index={map_index}&deserialize=true&stringify=false"
        )
        return self.api("GET", path)["value"]

    # ------------------------------------------------------------------ metadata database

    @property
    def engine(self) -> sa.Engine:
        """Read-side engine on the metadata DB (NullPool: holds no connection between calls)."""
        if self._engine is None:
            connect_args: dict[str, Any] = {}
            if self.sql_alchemy_conn.startswith("sqlite"):
                connect_args["timeout"] = 30
            self._engine = sa.create_engine(
                self.sql_alchemy_conn, poolclass=NullPool, connect_args=connect_args
            )
        return self._engine

    def query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        """Run read-only SQL against the metadata DB and return plain tuples."""
        with self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(sql), params)]

    def dag_is_parsed(self, dag_id: str) -> bool:
        rows = self.query(
            "SELECT d.is_stale FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
            "WHERE d.dag_id = :dag_id",
            dag_id=dag_id,
        )
        return any(not row[0] for row in rows)

    def import_errors(self) -> list[tuple[str, str]]:
        return [(str(r[0]), str(r[1])) for r in self.query("SELECT filename, stacktrace FROM import_error")]

    def wait_for_dag(self, dag_id: str, timeout: float | None = None) -> None:
        """Wait until the dag-processor has serialized ``dag_id`` into the metadata DB."""

        def detail() -> str:
            errors = self.import_errors()
            if not errors:
                return "no import errors recorded"
            return "import errors:\n" + "\n".join(f"{f}:\n{t[-1500:]}" for f, t in errors)

        self._wait(
            f"dag {dag_id} to be parsed",
            lambda: self.dag_is_parsed(dag_id),
            timeout if timeout is not None else self.startup_timeout,
            "dag-processor",
            interval=0.5,
            detail=detail,
        )

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id",
            dag_id=dag_id,
            run_id=run_id,
        )
        return None if not rows else rows[0][0]

    def wait_for_run(
        self, dag_id: str, run_id: str, timeout: float = 300.0, poll_interval: float = 0.5
    ) -> str:
        """Poll the metadata DB until the run is success/failed; return that state."""
        state: str | None = None

        def probe() -> bool:
            nonlocal state
            state = self.run_state(dag_id, run_id)
            return state in TERMINAL_RUN_STATES

        def detail() -> str:
            rows = self.task_instances(dag_id, run_id)
            summary = ", ".join(f"{r.task_id}[{r.map_index}]={r.state}" for r in rows)
            return f"run state {state}; task instances: {summary}"

        self._wait(
            f"run {dag_id}/{run_id} to finish",
            probe,
            timeout,
            "scheduler",
            interval=poll_interval,
            detail=detail,
        )
        assert state is not None
        return state

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskInstanceRow]:
        rows = self.query(
            "SELECT task_id, map_index, state, try_number, start_date, end_date, queued_dttm, "
            "duration FROM task_instance WHERE dag_id = :dag_id AND run_id = :run_id "
            "ORDER BY task_id, map_index",
            dag_id=dag_id,
            run_id=run_id,
        )
        return [
            TaskInstanceRow(
                task_id=str(r[0]),
                map_index=int(r[1]),
                state=r[2],
                try_number=int(r[3] or 0),
                start_date=_as_datetime(r[4]),
                end_date=_as_datetime(r[5]),
                queued_dttm=_as_datetime(r[6]),
                duration=None if r[7] is None else float(r[7]),
            )
            for r in rows
        ]

    def task_log_path(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> Path:
        """Local log file of one try, per the default 3.x ``[logging] log_filename_template``."""
        path = self.logs_dir / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            path = path / f"map_index={map_index}"
        return path / f"attempt={try_number}.log"

    def missing_task_logs(self, dag_id: str, run_id: str) -> list[Path]:
        """Log files absent for any try (1..try_number) of any task instance that ran."""
        missing: list[Path] = []
        for ti in self.task_instances(dag_id, run_id):
            for attempt in range(1, ti.try_number + 1):
                path = self.task_log_path(dag_id, run_id, ti.task_id, attempt, ti.map_index)
                if not path.is_file():
                    missing.append(path)
        return missing

    def callback_log_path(self, dag_id: str, run_id: str, callback_id: str) -> Path:
        """Log file of an executor callback (``ExecuteCallback.log_path``)."""
        return self.logs_dir / "executor_callbacks" / dag_id / run_id / callback_id

    def callbacks(self, dag_id: str | None = None, run_id: str | None = None) -> list[CallbackRow]:
        """Rows of the ``callback`` table; with dag_id/run_id only deadline callbacks of that run."""
        sql = (
            "SELECT c.id, c.type, c.state, c.fetch_method, c.data, c.output, c.created_at, "
            "d.deadline_time, d.missed FROM callback c "
            "LEFT JOIN deadline d ON d.callback_id = c.id "
            "LEFT JOIN dag_run r ON r.id = d.dagrun_id"
        )
        params: dict[str, Any] = {}
        clauses: list[str] = []
        if dag_id is not None:
            clauses.append("r.dag_id = :dag_id")
            params["dag_id"] = dag_id
        if run_id is not None:
            clauses.append("r.run_id = :run_id")
            params["run_id"] = run_id
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY c.created_at"
        result: list[CallbackRow] = []
        for r in self.query(sql, **params):
            data = _json_column(r[4])
            path = data.get("path")
            result.append(
                CallbackRow(
                    id=_uuid_text(r[0]),
                    type=str(r[1]),
                    state=r[2],
                    fetch_method=str(r[3]),
                    path=str(path) if path is not None else None,
                    output=r[5],
                    created_at=_as_datetime(r[6]),
                    data=data,
                    deadline_time=_as_datetime(r[7]),
                    deadline_missed=_as_bool(r[8]),
                )
            )
        return result

    def wait_for_callbacks(
        self,
        dag_id: str,
        run_id: str,
        *,
        count: int = 1,
        timeout: float = 120.0,
        states: Iterable[str] = TERMINAL_CALLBACK_STATES,
    ) -> list[CallbackRow]:
        """Wait until at least ``count`` deadline callbacks of the run are in one of ``states``."""
        wanted = frozenset(states)
        rows: list[CallbackRow] = []

        def probe() -> bool:
            nonlocal rows
            rows = self.callbacks(dag_id, run_id)
            return sum(1 for row in rows if row.state in wanted) >= count

        def detail() -> str:
            return "callbacks: " + ", ".join(f"{row.id}={row.state}" for row in rows)

        self._wait(
            f"{count} callback(s) of {dag_id}/{run_id} in {sorted(wanted)}",
            probe,
            timeout,
            "scheduler",
            detail=detail,
        )
        return rows


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        return False
    return True


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _uuid_text(value: object) -> str:
    # PostgreSQL returns a UUID (or canonical text), SQLite the 32-char hex form.
    if isinstance(value, uuid.UUID):
        return str(value)
    text = str(value)
    with contextlib.suppress(ValueError):
        return str(uuid.UUID(text))
    return text


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"
