"""What differs between the Airflow majors the adapter runs on (3.3, and 2.10/2.11): names and values.

Rule: a name Airflow moved or only one major has (the metrics client, the callback and connection-test
keys, the executor's configuration, the execution API's URL and client timeout) is resolved here once,
so no other module tests the version for it. How each major hands a workload over is
:mod:`~async_local_executor.adapter.intake`; what the adapter reads and writes in the metadata database
is :mod:`~async_local_executor.adapter.metadata_db`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow import __version__ as AIRFLOW_VERSION

AIRFLOW_V3 = int(AIRFLOW_VERSION.split(".", 1)[0]) >= 3

if TYPE_CHECKING:
    from async_local_executor.adapter.config import ConfSource

if AIRFLOW_V3:
    from airflow._shared.observability.metrics import stats
    from airflow.models.callback import CallbackKey
    from airflow.models.connection_test import ConnectionTestKey
else:
    from airflow.stats import Stats as stats  # type: ignore[no-redef]

    class CallbackKey:  # type: ignore[no-redef]
        """Airflow 2 has no callback workloads: no key is ever one of these."""

        id: str

    class ConnectionTestKey:  # type: ignore[no-redef]
        """Airflow 2 has no connection-test workloads: no key is ever one of these."""

        id: str


__all__ = [
    "AIRFLOW_V3",
    "AIRFLOW_VERSION",
    "CallbackKey",
    "ClientTimeout",
    "ConnectionTestKey",
    "client_timeout",
    "execution_api_url",
    "executor_conf",
    "stats",
]


def executor_conf(executor: object) -> ConfSource:
    """The executor's configuration: its team-aware ``conf`` on Airflow 3, the global one on Airflow 2."""
    own = getattr(executor, "conf", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    from airflow.configuration import conf

    return conf


def execution_api_url(conf: Any) -> str:
    """Where Airflow 3 task processes reach the API; Airflow 2 tasks use the database instead."""
    if not AIRFLOW_V3:
        return ""
    from airflow.executors.base_executor import get_execution_api_server_url

    return str(get_execution_api_server_url(conf))


# Airflow's default [workers] execution_api_timeout is 5 s. A burst of task starts queues their first
# calls at the api-server past that; the task SDK then retries PATCH .../run, and in Airflow 3.3 on SQLite
# a late original can put a task that already finished back to running, which the scheduler then fails.
CLIENT_TIMEOUT_OPTION = ("workers", "execution_api_timeout")
SAFE_CLIENT_TIMEOUT = 60.0


@dataclass(frozen=True)
class ClientTimeout:
    """The execution-API client timeout task processes get, and why: the executor's one start line.

    :ivar env: what task processes get on top of the scheduler's environment (empty: nothing changed)
    :ivar seconds: the timeout their client then uses
    :ivar reason: where that value comes from, for the start line
    """

    env: dict[str, str]
    seconds: float
    reason: str

    def describe(self) -> str:
        section, key = CLIENT_TIMEOUT_OPTION
        verb = "get" if self.env else "keep"
        return f"task processes {verb} [{section}] {key} = {self.seconds:g}s: {self.reason}"


def client_timeout(conf: Any, environ: Mapping[str, str]) -> ClientTimeout | None:
    """The client timeout for task processes: a safe one unless the operator chose another (Airflow 3).

    Airflow writes every option with its default into the ``airflow.cfg`` it generates, so a value in
    the file equal to Airflow's default is not taken as a choice; a different value, or the option's
    environment variable, is. Airflow 2 tasks use the database, not the API: nothing to choose there.
    """
    if not AIRFLOW_V3:
        return None
    import configparser

    section, key = CLIENT_TIMEOUT_OPTION
    variable = f"AIRFLOW__{section.upper()}__{key.upper()}"
    configured = conf.getfloat(section, key)
    if variable in environ:
        return ClientTimeout({}, configured, f"set in the environment ({variable})")
    default = float(conf.get_default_value(section, key))
    # RawConfigParser's own has_option: Airflow's also answers true for a default or the environment.
    in_file = configparser.ConfigParser.has_option(conf, section, key)
    if in_file and configured != default:
        return ClientTimeout({}, configured, "set in airflow.cfg")
    where = "in airflow.cfg as Airflow writes it" if in_file else "not set"
    return ClientTimeout(
        {variable: f"{SAFE_CLIENT_TIMEOUT:g}"},
        SAFE_CLIENT_TIMEOUT,
        f"Airflow's default of {default:g}s ({where}) lets a burst of task starts wait past it at the "
        f"api-server and be retried unsafely, failing tasks that succeeded; any other value, or "
        f"{variable} in the scheduler's environment, is kept as your choice",
    )
