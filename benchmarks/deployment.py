"""Executor variants and one benchmark deployment: a fresh sandbox per run, for the installed Airflow."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from benchmarks import timed_executor
from benchmarks.probes import HeartbeatLog, HeartbeatRecord, LoopProbe, own_cpu_seconds, tree_cpu_seconds
from benchmarks.roles import RoleAccount
from harness.airflow2 import Airflow2Sandbox
from harness.sandbox import AirflowSandbox, installed_airflow_major

REPO_ROOT: Final[Path] = Path(__file__).resolve().parent.parent
DAGS_FOLDER: Final[Path] = Path(__file__).resolve().parent / "dags"
LAUNCHER_ENV: Final[str] = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER"
IDLE_TIMEOUT_ENV: Final[str] = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__FORKSERVER_IDLE_TIMEOUT"
OURS: Final[str] = "async_local_executor.AsyncLocalExecutor"


@dataclass(frozen=True)
class Variant:
    """An executor under test: a label, the ``[core] executor`` class path, extra environment."""

    label: str
    executor: str
    env: Mapping[str, str] = field(default_factory=dict)


KNOWN_VARIANTS: Final[dict[str, Variant]] = {
    "stock": Variant("stock", "LocalExecutor"),
    "ours": Variant("ours", OURS),
    "ours-forkserver": Variant("ours-forkserver", OURS, {LAUNCHER_ENV: "forkserver"}),
    "ours-subprocess": Variant("ours-subprocess", OURS, {LAUNCHER_ENV: "subprocess"}),
    # The fork server started by the first workload and stopped after 60 s without one.
    "ours-ondemand": Variant("ours-ondemand", OURS, {IDLE_TIMEOUT_ENV: "60"}),
}
BASELINE: Final[str] = "stock"


def parse_variant(spec: str) -> Variant:
    """A known label, or ``label=class.path[:KEY=VALUE[;KEY=VALUE...]]`` (``,`` too, in a single spec)."""
    spec = spec.strip()
    if "=" not in spec.split(":", 1)[0]:
        try:
            return KNOWN_VARIANTS[spec]
        except KeyError:
            raise ValueError(
                f"unknown variant {spec!r}; known: {', '.join(KNOWN_VARIANTS)} or label=class.path[:K=V,...]"
            ) from None
    label, _, rest = spec.partition("=")
    path, _, env_spec = rest.partition(":")
    env: dict[str, str] = {}
    # `;` between items: on the command line, a comma before KEY= would start the next variant.
    for item in filter(None, re.split(r"[;,]", env_spec)):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant env item must be KEY=VALUE: {item!r}")
        env[key] = value
    if not label or not path:
        raise ValueError(f"variant spec must be label=class.path[:K=V,...]: {spec!r}")
    return Variant(label, path, env)


# The roles the account takes whole from Airflow's other processes, by process name.
OTHER_ROLES: Final = {"api_server": "api-server", "dag_processor": "dag-processor"}


@dataclass
class Deployment:
    sandbox: AirflowSandbox
    heartbeat_log: Path
    variant_env: Mapping[str, str] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        """Cumulative CPU seconds per Airflow process tree, and of the scheduler process alone."""
        figures = {name: tree_cpu_seconds(pid) for name, pid in self.sandbox.pids.items()}
        figures["scheduler-process"] = own_cpu_seconds(self.scheduler_pid)
        return figures

    def role_account(self) -> RoleAccount:
        """An account of each task's CPU by role, for a phase of this deployment."""
        pids = self.sandbox.pids
        # Airflow 2's deployment is its scheduler alone (its DAG processor is the scheduler's child).
        others = {role: pids[name] for role, name in OTHER_ROLES.items() if name in pids}
        return RoleAccount(
            self.scheduler_pid,
            others,
            self.sandbox.process_logs["scheduler"],
        )

    @property
    def scheduler_pid(self) -> int:
        return self.sandbox.pids["scheduler"]

    def heartbeats(self) -> HeartbeatLog:
        return HeartbeatLog.read(self.heartbeat_log)

    def query(self, sql: str) -> list[tuple[object, ...]]:
        return self.sandbox.query(sql)

    def loop_probe(self) -> LoopProbe:
        """The scheduler job's heartbeats: sampled, and every one recorded by the database."""
        return LoopProbe(self.query, HeartbeatRecord(self.sandbox.engine))

    def wait_executor_ready(self, timeout: float) -> None:
        """Wait for what an executor prepares at start; a kept-warm fork server imports for seconds.

        Measurements start from a ready scheduler, as in a deployment that has been up a while: the
        helper's one-time imports would otherwise land in the first tasks' CPU and start latency.
        """
        info = self.executor_info()
        if info.get("launcher") != "forkserver" or IDLE_TIMEOUT_ENV in self.variant_env:
            return
        log = self.sandbox.process_logs["scheduler"]
        deadline = time.monotonic() + timeout
        # The scheduler's log is the only signal; the deadline bounds a helper that never starts.
        while "fork server ready (pid" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fork server was not ready within {timeout:.0f}s (see {log})")
            time.sleep(0.2)

    def executor_info(self) -> dict[str, str]:
        """What the executor said about itself when it started (its launcher, for AsyncLocalExecutor)."""
        return executor_info(self.sandbox.process_logs["scheduler"])


_STARTED = re.compile(r"AsyncLocalExecutor started: ([^\n]*)")


def executor_info(log: Path) -> dict[str, str]:
    # The source under test can change between runs (work in progress): record what actually ran.
    try:
        match = _STARTED.search(log.read_text(errors="replace"))
    except FileNotFoundError:
        return {}
    if match is None:
        return {}
    info = {"started": match.group(1).strip()}
    launcher = re.search(r"launcher=(\w+)", match.group(1))
    if launcher:
        info["launcher"] = launcher.group(1)
    return info


@contextlib.contextmanager
def deployment(
    variant: Variant,
    *,
    parallelism: int,
    database: str,
    dag_env: Mapping[str, str],
    progress: Callable[[str], None] | None,
    keep_home: bool = False,
    airflow_env: Mapping[str, str] | None = None,
    airflow_cfg: str = "generated",
    dags_folder: Path = DAGS_FOLDER,
) -> Iterator[Deployment]:
    """Start a fresh sandbox running ``variant`` with the benchmark DAGs; stop and remove it after.

    ``airflow_env`` is a case's own Airflow configuration (``AIRFLOW__SECTION__KEY`` variables) on top
    of the sandbox's; a variant's environment still comes last. ``airflow_cfg`` goes to the sandbox:
    ``"generated"`` (Airflow writes its own, as on a deployment) or ``"empty"``.
    ``dags_folder`` is what the dag-processor parses: a scenario whose DAG files import heavy libraries
    keeps them in a folder of its own, so the other scenarios' deployments never parse them.
    """
    home = Path(tempfile.mkdtemp(prefix=f"ale-bench-{variant.label}-"))
    heartbeat_log = home / "executor-heartbeats.log"
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    env = {
        # benchmarks.timed_executor must be importable by the scheduler (and the api-server).
        "PYTHONPATH": pythonpath,
        timed_executor.TARGET_ENV: variant.executor,
        timed_executor.LOG_ENV: str(heartbeat_log),
        # The default pool's 128 slots would cap a 256-way burst before parallelism does; read at migrate.
        "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": str(max(512, parallelism)),
        **dict(airflow_env or {}),
        **dict(dag_env),
        **dict(variant.env),
    }
    # Airflow 2 is a scheduler alone, on PostgreSQL (it refuses SQLite for a parallel executor).
    kind = AirflowSandbox if installed_airflow_major() >= 3 else Airflow2Sandbox
    sandbox = kind(
        executor=timed_executor.CLASS_PATH,
        database=database,
        dags_folder=dags_folder,
        parallelism=parallelism,
        extra_config=env,
        home=home,
        progress=progress,
        airflow_cfg=airflow_cfg,
    )
    failed = True
    try:
        with sandbox:
            yield Deployment(sandbox, heartbeat_log, dict(variant.env))
        failed = False
    finally:
        if keep_home or failed:
            if progress is not None:
                progress(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
