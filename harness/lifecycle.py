"""A throwaway Airflow's setup and teardown: configuration, home, database, processes, health.

:class:`SandboxLifecycle` holds the parts (:mod:`harness.environment`, :mod:`harness.postgres`,
:mod:`harness.templates`, :mod:`harness.processes`, :mod:`harness.rest`, :mod:`harness.metadata`) and
brings the deployment up and down; :class:`harness.sandbox.AirflowSandbox` builds on it what a test does with the deployment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from harness import cgroups, templates, waits
from harness.environment import (
    AIRFLOW_CFG_KINDS,
    DEFAULT_DAGS_FOLDER,
    DEMO_CALLBACK_DIR_ENV,
    HomeLayout,
    airflow_env,
    choose_database,
    free_port,
    local_url,
    prepare_home,
    simple_auth_users,
    write_passwords,
)
from harness.metadata import MetadataDB
from harness.postgres import PostgresDatabase
from harness.processes import Processes
from harness.rest import RestClient
from harness.waits import SandboxError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PROCESS_NAMES", "Progress", "SandboxLifecycle"]

PROCESS_NAMES: Final[tuple[str, ...]] = ("api-server", "scheduler", "dag-processor")

Progress = Callable[[str], None]


def _log(message: str) -> None:
    print(f"[sandbox] {message}", file=sys.stderr, flush=True)


class SandboxLifecycle:
    """A throwaway Airflow's setup and teardown: its configuration, ``start()``, health, ``stop()``.

    :class:`harness.sandbox.AirflowSandbox` adds what a test does with the running deployment.

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
        calls to the api-server, in seconds, set in the environment as an operator's choice; None (the
        default) leaves it as ``airflow.cfg`` has it.
    :param airflow_cfg: ``"generated"`` (the default): Airflow writes the home's ``airflow.cfg`` on
        its first command, every option with its default, as on a deployment's first start;
        ``"empty"``: an empty file, so options the environment does not set are unset.
    :param template: copy the metadata database and ``airflow.cfg`` from a home migrated once per
        process for this kind of home (:mod:`harness.templates`), which is what ``airflow db migrate``
        would leave; False runs ``airflow db migrate`` in this home. A database given by URL is always
        migrated.
    :param nofile: ``RLIMIT_NOFILE`` as (soft, hard) for some processes by name, e.g.
        ``{"scheduler": (100, 100)}``: the others keep this process's. Each start (and restart) of that
        process runs under ``prlimit`` (:mod:`harness.processes` says why); raising a hard limit above
        this process's needs privilege.
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
        execution_api_timeout: float | None = None,
        airflow_cfg: str = "generated",
        users: Mapping[str, str] | None = None,
        template: bool = True,
        nofile: Mapping[str, tuple[int, int]] | None = None,
        progress: Progress | None = _log,
    ) -> None:
        if parallelism < 1:
            raise ValueError("parallelism must be >= 1")
        if execution_api_timeout is not None and execution_api_timeout <= 0:
            raise ValueError("execution_api_timeout must be > 0 or None")
        if airflow_cfg not in AIRFLOW_CFG_KINDS:
            raise ValueError(
                f"airflow_cfg must be one of {', '.join(AIRFLOW_CFG_KINDS)}, not {airflow_cfg!r}"
            )
        self.execution_api_timeout = execution_api_timeout
        self.airflow_cfg = airflow_cfg
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
        self.template = template
        self._progress = progress
        self._owns_home = home is None
        self.home = (
            Path(home).resolve() if home is not None else Path(tempfile.mkdtemp(prefix="airflow-sandbox-"))
        )
        self._layout = HomeLayout(self.home)
        self.marker = uuid.uuid4().hex
        self.api_port = free_port()
        self.log_server_port = free_port()
        self.api_url = local_url(self.api_port)
        self.sql_alchemy_conn, self._postgres = choose_database(database, self.home)
        self._extra_config = dict(extra_config or {})
        self.extra_processes = {name: tuple(args) for name, args in (extra_processes or {}).items()}
        for name in self.extra_processes:
            if name in ("db-migrate", *PROCESS_NAMES) or not name or "/" in name:
                raise ValueError(f"invalid extra process name: {name!r}")
        self._started = False
        # Users of the simple auth manager (name -> role), each with a password of its own; without
        # them, every request is an admin request and nobody logs in.
        self.passwords = {name: secrets.token_urlsafe(16) for name in users or {}}
        self._env = self._build_env()
        if users:
            self._env.update(simple_auth_users(users))
        self._processes = Processes(
            env=self._env,
            home=self.home,
            python=self.python,
            logs=self.process_logs,
            commands=self.extra_processes,
            marker=self.marker,
            stop_timeout=stop_timeout,
            say=self._say,
            nofile=nofile,
        )
        admin = next((name for name, role in (users or {}).items() if role.lower() == "admin"), None)
        if users and admin is None:
            raise ValueError("users need an admin, for the sandbox's own REST calls")
        self._rest = RestClient(self.api_url, None if admin is None else (admin, self.passwords[admin]))
        self._db = MetadataDB(self.sql_alchemy_conn)

    # ------------------------------------------------------------------ configuration

    @property
    def env(self) -> dict[str, str]:
        """A copy of the full environment given to every Airflow process of this sandbox."""
        return dict(self._env)

    @property
    def postgres(self) -> PostgresDatabase | None:
        """The PostgreSQL database this sandbox creates at start and drops at stop, if it has one."""
        return self._postgres

    @property
    def owns_postgres(self) -> bool:
        return self._postgres is not None

    @property
    def airflow_cfg_path(self) -> Path:
        """The home's ``airflow.cfg`` (``AIRFLOW_CONFIG``): Airflow's generated one unless asked otherwise."""
        return Path(self._env["AIRFLOW_CONFIG"])

    @property
    def logs_dir(self) -> Path:
        """``[logging] base_log_folder``: task logs and executor callback logs live here."""
        return self._layout.logs

    @property
    def proc_logs_dir(self) -> Path:
        return self._layout.proc_logs

    @property
    def process_logs(self) -> dict[str, Path]:
        """stdout+stderr file of each long-running process, plus ``db-migrate``."""
        names = ("db-migrate", *self.process_names, *self.extra_processes)
        return {name: self._layout.process_log(name) for name in names}

    @property
    def callback_dir(self) -> Path:
        """Where the demo DAG's deadline callback writes ``<run_id>.json``."""
        return Path(self._env[DEMO_CALLBACK_DIR_ENV])

    def _build_env(self) -> dict[str, str]:
        env = airflow_env(
            home=self._layout,
            bin_dir=self.bin_dir,
            marker=self.marker,
            executor=self.executor,
            dags_folder=self.dags_folder,
            parallelism=self.parallelism,
            sql_alchemy_conn=self.sql_alchemy_conn,
            api_port=self.api_port,
            log_server_port=self.log_server_port,
            execution_api_timeout=self.execution_api_timeout,
        )
        env.update(cgroups.sandbox_env())
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
            self.prepare()
            for name in (*self.process_names, *self.extra_processes):
                with self._step(f"starting {name}"):
                    self._processes.spawn(name)
            with self._step(f"waiting for {', '.join(self.process_names)} to be healthy"):
                self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop(keep_home=True)
            raise

    def prepare(self) -> None:
        """The home and its metadata database as ``airflow db migrate`` leaves them; :meth:`start` begins here."""
        prepare_home(self._layout, self._env, self.callback_dir, self.airflow_cfg)
        if self.passwords:
            write_passwords(self._env, self.passwords)
        if self.template and templates.key_of(self) is not None:
            # The first home of its kind in this process migrates the template: one `airflow db migrate`.
            with self._step("copying a migrated database and airflow.cfg from this kind of home's template"):
                templates.template_for(self).copy_into(self.home, self._postgres)
        else:
            if self._postgres is not None:
                with self._step(f"creating postgresql database {self._postgres.name}"):
                    self._postgres.create()
            with self._step("airflow db migrate"):
                self._processes.migrate(self.startup_timeout * 2)
        if not self.airflow_cfg_path.is_file():
            raise SandboxError(f"airflow db migrate wrote no {self.airflow_cfg_path}")

    def stop(self, *, keep_home: bool | None = None) -> None:
        """Stop every process (SIGTERM, bounded wait, SIGKILL), drop the database, clean up.

        Safe to call more than once and after a failed ``start()``.
        """
        keep = self.keep_home if keep_home is None else keep_home
        if self._processes.started:
            with self._step("stopping airflow processes"):
                self._processes.terminate_all()
        with self._step("killing leftovers"):
            self._processes.kill_leftovers()
        cgroups.remove_from(self._env)
        self._processes.close_logs()
        self._db.dispose()
        if self._postgres is not None:
            try:
                self._postgres.drop()
            except Exception as exc:  # noqa: BLE001 - cleanup must go on; say what failed
                self._say(f"could not drop database {self._postgres.name}: {exc}")
        if self._owns_home and not keep and self.home.exists():
            shutil.rmtree(self.home, ignore_errors=True)
        elif self.home.exists():
            self._say(f"kept home {self.home}")

    # ------------------------------------------------------------------ watching the processes

    def log_tail(self, name: str, lines: int = 60) -> str:
        return self._processes.log_tail(name, lines)

    def check_processes(self) -> None:
        """Raise if one of the long-running processes has exited."""
        self._processes.check()

    def _wait(
        self,
        what: str,
        probe: Callable[[], bool],
        timeout: float,
        log_name: str,
        interval: float = 0.25,
        detail: Callable[[], str] | None = None,
    ) -> None:
        waits.poll_until(
            what,
            probe,
            timeout,
            check=self.check_processes,
            log_name=log_name,
            log_tail=self.log_tail,
            interval=interval,
            detail=detail,
        )

    def health(self) -> dict[str, Any] | None:
        """The ``/api/v2/monitor/health`` document, or None while the api-server is not up."""
        return self._rest.health()

    def wait_healthy(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the api-server answers and reports scheduler and dag-processor healthy."""
        return waits.wait_healthy(self, timeout)
