"""Which of the scheduler's processes the executor records as companions of its journal.

Real ``multiprocessing`` children, titled as Airflow's helpers title themselves (setproctitle, as
Airflow does); no scheduler.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import time
from collections.abc import Iterator

import pytest
from setproctitle import setproctitle

from async_local_executor.adapter.scheduler_helpers import companions, is_airflow_helper


def _titled(title: str, ready: multiprocessing.synchronize.Event) -> None:
    if title:
        setproctitle(title)
    ready.set()
    time.sleep(600)  # until the parent kills it


@pytest.fixture
def children() -> Iterator[dict[str, int]]:
    ctx = multiprocessing.get_context("fork")
    titles = [
        "airflow serve-logs",
        "gunicorn: master [gunicorn]",
        "airflow worker -- LocalExecutor: <idle>",
        "",
    ]
    started: dict[str, int] = {}
    procs = []
    try:
        for title in titles:
            ready = ctx.Event()
            proc = ctx.Process(target=_titled, args=(title, ready))
            proc.start()
            procs.append(proc)
            assert ready.wait(30)
            assert proc.pid is not None
            started[title] = proc.pid
        yield started
    finally:
        for proc in procs:
            proc.kill()
            proc.join(30)


def test_the_log_servers_are_companions_and_other_executors_workers_and_other_children_are_not(
    children: dict[str, int],
) -> None:
    found = {companion.pid: companion.what for companion in companions()}
    assert found == {
        children["airflow serve-logs"]: "airflow serve-logs",
        children["gunicorn: master [gunicorn]"]: "gunicorn: master [gunicorn]",
    }


@pytest.mark.parametrize(
    ("words", "helper"),
    [
        (["/venv/bin/python3", "/venv/bin/airflow", "scheduler"], True),  # the health-check server
        (["/venv/bin/python3", "-m", "airflow", "scheduler"], True),
        (["airflow serve-logs"], True),
        (["gunicorn: master [gunicorn]"], True),
        (["airflow worker -- LocalExecutor: <idle>"], False),
        (["/venv/bin/python3", "-m", "pytest"], False),
        ([], False),
    ],
)
def test_a_child_is_told_by_its_command_line(words: list[str], helper: bool) -> None:
    assert is_airflow_helper(words) is helper
