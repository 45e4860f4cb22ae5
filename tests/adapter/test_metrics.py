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


# A contained workload's final event: what its cgroup used and held (64 MiB peak, 2.5 s of CPU, three
# processes left behind, one OOM kill), then one whose cgroup accounted nothing and held nothing.
CLEANUP_DRIVER = """
from async_local_executor.adapter.compat import AIRFLOW_V3
from async_local_executor.adapter.metrics import Metrics
if AIRFLOW_V3:  # as BaseExecutor.__init__ does: until then Stats sends nothing
    from airflow._shared.observability.metrics import stats
    from airflow.configuration import conf
    from airflow.observability.metrics import stats_utils
    stats.initialize(
        factory=stats_utils.get_stats_factory(),
        export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
    )
from async_local_executor.core.outcome import Cleanup, Outcome, OutcomeKind
metrics = Metrics()
used = Cleanup(leftovers=3, killed=3, oom_kills=1, memory_peak=64 << 20, cpu_seconds=2.5)
metrics.final_event(Outcome("used", OutcomeKind.SIGNALLED, -9, cleanup=used))
metrics.final_event(Outcome("quiet", OutcomeKind.EXITED, 0, cleanup=Cleanup()))
metrics.final_event(Outcome("cleared under it", OutcomeKind.EXITED, 4, cleanup=Cleanup()), gone=True)
"""


def statsd_env(sock: socket.socket) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }


def parsed(line: str) -> tuple[str, float, str]:
    """``name:value|type`` (how the value is formatted is the StatsD client's business)."""
    name, _, rest = line.partition(":")
    value, _, kind = rest.partition("|")
    return name, float(value), kind


@pytest.mark.parametrize("launcher", ["forkserver"], indirect=True)
def test_metrics_reach_statsd(listener: socket.socket, launcher: str) -> None:
    driver = subprocess.run(
        [sys.executable, "-m", "tests.adapter.statsd_driver"],
        env=statsd_env(listener),
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
        "airflow.async_local_executor.paused|g",
        "airflow.async_local_executor.parallelism|g",
        "airflow.async_local_executor.control.paused|g",
        "airflow.async_local_executor.control.draining|g",
    }
    assert expected - names == set(), sorted(names)
    assert "airflow.async_local_executor.control.paused:1|g" in lines
    assert "airflow.async_local_executor.control.paused:0|g" in lines
    assert "airflow.async_local_executor.memory_guard_holding:1|g" in lines
    assert "airflow.async_local_executor.memory_guard_waits:1|c" in lines


@pytest.mark.parametrize("launcher", ["forkserver"], indirect=True)  # nothing launches: one path is enough
def test_a_contained_workloads_usage_reaches_statsd_with_its_final_event(
    listener: socket.socket, launcher: str
) -> None:
    driver = subprocess.run(
        [sys.executable, "-c", CLEANUP_DRIVER],
        env=statsd_env(listener),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
    lines = received(listener)
    sent = sorted(parsed(line) for line in lines if ".workload." in line)
    assert sent == [
        ("airflow.async_local_executor.workload.cpu_time", 2500.0, "ms"),
        ("airflow.async_local_executor.workload.leftover_processes", 3, "c"),
        ("airflow.async_local_executor.workload.memory_peak_mb", 64.0, "g"),
        ("airflow.async_local_executor.workload.oom_kills", 1, "c"),
    ]
    finals = sorted(line for line in lines if ".final_events." in line)
    assert finals == [
        "airflow.async_local_executor.final_events.gone:1|c",
        "airflow.async_local_executor.final_events.killed:1|c",
        "airflow.async_local_executor.final_events.success:1|c",
    ]
