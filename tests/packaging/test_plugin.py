"""The Airflow plugin as Airflow finds it: its entry point, what it registers, and its app on its own.

The app is served here in process (httpx's ASGI transport) over real status files; its authenticated
endpoint needs Airflow's auth manager, which lives in a running api-server: tests/e2e/test_health_api.py
has it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from async_local_executor.core.health import Health, Report, Verdict
from async_local_executor.ops.status import StatusWriter, status_path
from async_local_executor.plugin import PREFIX, AsyncLocalExecutorPlugin
from async_local_executor.plugin import app as plugin_app
from async_local_executor.plugin.app import STATIC, create_app
from tests.states import meta, quiet


def test_the_package_registers_the_plugin_through_its_entry_point() -> None:
    [entry] = [e for e in metadata.entry_points(group="airflow.plugins") if e.name == "async_local_executor"]
    assert entry.load() is AsyncLocalExecutorPlugin


def test_the_plugin_mounts_its_app_and_adds_a_nav_entry_and_a_dashboard_card() -> None:
    plugin = AsyncLocalExecutorPlugin()
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == PREFIX == "/async-local-executor"
    [view] = plugin.external_views
    assert (view["name"], view["destination"], view["url_route"]) == (
        "Executor",
        "nav",
        "async-local-executor",
    )
    [card] = plugin.react_apps
    assert card["destination"] == "dashboard"
    # Relative to the UI's <base href>, and shipped in the package.
    for url in (view["href"], view["icon"], view["icon_dark_mode"], card["bundle_url"]):
        assert url.startswith("async-local-executor/")
    for url in (view["icon"], view["icon_dark_mode"], card["bundle_url"]):
        assert (STATIC / url.removeprefix("async-local-executor/static/")).is_file()


def test_loading_the_plugin_builds_no_app() -> None:
    # Task processes load plugins too: they must not pay for FastAPI and Airflow's security module.
    code = (
        "import sys; from async_local_executor.plugin import AsyncLocalExecutorPlugin as P; P(); "
        "print(sorted(m for m in ('fastapi', 'async_local_executor.plugin.app') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.asyncio
async def test_the_app_serves_health_the_page_and_its_assets(tmp_path: Path) -> None:
    StatusWriter(status_path(tmp_path, "a"), meta("a", parallelism=2)).write(
        Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), quiet())
    )
    transport = httpx.ASGITransport(app=create_app(tmp_path))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        health = await client.get("/health")
        assert health.status_code == 200
        assert health.headers["cache-control"] == "no-store"
        assert health.json()["status"] == "healthy"
        page = await client.get("/ui")
        assert page.status_code == 200
        assert "frame-ancestors 'self'" in page.headers["content-security-policy"]
        assert 'src="static/executor.js"' in page.text
        for asset in ("executor.js", "executor.css", "dashboard-card.js", "icon.svg"):
            assert (await client.get(f"/static/{asset}")).status_code == 200


@pytest.mark.asyncio
async def test_the_app_answers_a_malformed_status_file_without_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Airflow's auth manager lives in a running api-server (tests/e2e/test_health_api.py): anyone may see.
    monkeypatch.setattr(plugin_app, "_viewer", lambda: lambda: None)
    writer = StatusWriter(status_path(tmp_path, "a"), meta("a", parallelism=2))
    writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), quiet()))
    data = json.loads(writer.path.read_text())
    data.update(recent_finished=[1, {"key": "t try 1"}], loop_lag_ms=float("nan"), waiting="3")
    writer.path.write_text(json.dumps(data))  # NaN, as Python's json writes it

    transport = httpx.ASGITransport(app=create_app(tmp_path))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        status = await client.get("/status")
        assert status.status_code == 200
        [executor] = status.json()["executors"]
        assert sorted(executor["problems"]) == [
            "loop_lag_ms: not a finite number",
            "recent_finished[0]: not an object",
            "recent_finished[1]: no at",
            "waiting: not a count",
        ]
        assert executor["recent_finished"] == []
        health = await client.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "healthy"
