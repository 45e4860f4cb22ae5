"""Tasks that record what they can observe of their own process, on both Airflow majors.

The file imports pandas and numpy at its top, as a data pipeline's DAG file does, so that with the
default options the fork server learns and preloads them. Each task returns, as its XCom, what a task's
code could depend on: random draws (Python's ``random``, NumPy's global generator, and a generator a
library seeds when it is imported: ``more_itertools.recipes``), its descriptors, signal dispositions,
environment, working directory, umask, limits, ``sys.path``, logging, warnings filters, socket timeout,
locale, threads, CPU scheduling and what is imported (more_itertools is imported at the top too: it is
learned as well). ``tests/e2e/fingerprint.py`` compares the runs.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import numpy
import pandas
from more_itertools import recipes

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task

# How many tasks: the tests say (tests/e2e/fingerprint.py), a measurement can ask for more.
TASKS = int(os.environ.get("ALE_FINGERPRINT_TASKS", "6"))


def _fd_kind(fd: str) -> str:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "gone"
    for kind in ("socket", "pipe", "anon_inode"):
        if target.startswith(kind):
            return target.split(":", 1)[0] + (
                ":" + target.split("[", 1)[-1].rstrip("]") if kind == "anon_inode" else ""
            )
    return "file:" + target


def _handler(value: Any) -> str:
    import signal

    if value is signal.SIG_DFL:
        return "default"
    if value is signal.SIG_IGN:
        return "ignore"
    if value is None:
        return "not python"
    return "python:" + getattr(value, "__qualname__", type(value).__name__)


def observe() -> dict[str, Any]:
    import atexit
    import locale
    import logging
    import random
    import resource
    import signal
    import socket
    import sys
    import threading
    import warnings

    umask = os.umask(0)
    os.umask(umask)
    return {
        "draw.random": random.random(),  # noqa: S311 - what a task's own code draws
        "draw.numpy": float(numpy.random.rand()),
        "draw.module_generator": recipes._private_randrange(2**53),
        "pandas": pandas.__version__,
        "fds": {fd: _fd_kind(fd) for fd in sorted(os.listdir("/proc/self/fd"), key=int)},
        "signals": {
            str(int(s)): _handler(signal.getsignal(s))
            for s in sorted(signal.valid_signals())
            if s not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "environment": sorted(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "rlimits": {
            name: list(resource.getrlimit(getattr(resource, name)))
            for name in sorted(dir(resource))
            if name.startswith("RLIMIT_")
        },
        "sys.path": list(sys.path),
        "root logger": {
            "level": logging.getLogger().level,
            "handlers": [type(h).__name__ for h in logging.getLogger().handlers],
            "disabled": logging.root.manager.disable,
        },
        "warnings": [
            [f[0], getattr(f[1], "pattern", f[1]), f[2].__name__, getattr(f[3], "pattern", f[3]), f[4]]
            for f in warnings.filters
        ],
        "socket timeout": socket.getdefaulttimeout(),
        "locale": locale.setlocale(locale.LC_ALL),
        "recursion limit": sys.getrecursionlimit(),
        "exit hooks": atexit._ncallbacks(),
        "threads": len(os.listdir("/proc/self/task")),
        "python threads": sorted(t.name for t in threading.enumerate()),
        "scheduling": [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)],
        "modules": sorted(sys.modules),
        "gc frozen": __import__("gc").get_freeze_count() > 0,
        "pid": os.getpid(),
        # For comparing runs of different deployments: their own paths.
        "home": os.environ.get("AIRFLOW_HOME", "/nonexistent"),
        "dags": os.path.dirname(os.path.abspath(__file__)),
    }


@dag(
    dag_id="fingerprint",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=TASKS,
)
def fingerprint():
    @task(retries=0)
    def look(i: int) -> dict[str, Any]:
        return observe()

    look.expand(i=list(range(TASKS)))


fingerprint()
