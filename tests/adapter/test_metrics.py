"""The executor's metrics reach a real StatsD listener (a UDP socket on loopback), through Airflow's Stats."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adapter.driver import GUARD

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    # Loopback UDP is delivered when it is sent: once the sender has exited, everything is queued here.
    sock.setblocking(False)
    lines: list[str] = []
    while True:
        try:
            lines += sock.recv(65536).decode().splitlines()
        except BlockingIOError:
            return lines


@pytest.mark.parametrize("launcher", ["forkserver"], indirect=True)
def test_metrics_reach_statsd(listener: socket.socket, launcher: str) -> None:
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    driver = subprocess.run(
        [sys.executable, "-m", "tests.adapter.statsd_driver"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD * 3,
        check=False,
    )
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
    lines = received(listener)
    names = {line.split(":", 1)[0] + "|" + line.rsplit("|", 1)[-1] for line in lines}
    expected = {
        # Airflow's own executor gauges, true because `running` is kept.
        "airflow.executor.open_slots|g",
        "airflow.executor.running_tasks|g",
        "airflow.executor.queued_tasks|g",
        # This executor's.
        "airflow.async_local_executor.launch_latency|ms",
        "airflow.async_local_executor.final_events.success|c",
        "airflow.async_local_executor.final_events.failed|c",
        "airflow.async_local_executor.final_events.not_started|c",
        "airflow.async_local_executor.loop_lag|g",
        "airflow.async_local_executor.waiting|g",
        "airflow.async_local_executor.healthy|g",
        "airflow.async_local_executor.memory_guard_holding|g",
        "airflow.async_local_executor.memory_guard_waits|c",
    }
    assert expected - names == set(), sorted(names)
    assert "airflow.async_local_executor.memory_guard_holding:1|g" in lines
    assert "airflow.async_local_executor.memory_guard_waits:1|c" in lines
