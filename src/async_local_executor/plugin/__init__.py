"""The Airflow plugin: the executor's health on Airflow's own api-server and in its UI.

Registered through the ``airflow.plugins`` entry point, so installing the package is enough (``airflow
plugins`` lists it). On Airflow 3 it mounts :mod:`~async_local_executor.plugin.app` at
``/async-local-executor`` in the api-server, adds an "Executor" entry to the UI's navigation (an external
view of that app's page) and a health card on the home dashboard (a React app whose bundle the app
serves). Airflow 2 has no FastAPI api-server: there the plugin registers nothing.

Every process that loads plugins instantiates this class, task processes included, so importing this
module imports nothing beyond Airflow's plugin base; the app is built the first time the api-server asks.
"""

from __future__ import annotations

import functools
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from async_local_executor.adapter.compat import AIRFLOW_V3

NAME = "async_local_executor"
PREFIX = "/async-local-executor"
# Relative to the UI's <base href>, so that a deployment under a path prefix ([api] base_url) works too.
RELATIVE = PREFIX.lstrip("/")


@functools.cache
def _app() -> Any:
    from async_local_executor.plugin.app import create_app

    return create_app()


# What the UI shows: a button of its own in the side bar, and a card on the home dashboard.
EXTERNAL_VIEW = {
    "name": "Executor",
    "href": f"{RELATIVE}/ui",
    "url_route": "async-local-executor",
    "destination": "nav",
    "nav_top_level": True,
    "icon": f"{RELATIVE}/static/icon.svg",
    "icon_dark_mode": f"{RELATIVE}/static/icon-dark.svg",
}
DASHBOARD_CARD = {
    "name": "Executor health",
    "bundle_url": f"{RELATIVE}/static/dashboard-card.js",
    "url_route": "async-local-executor-card",
    "destination": "dashboard",
}


class AsyncLocalExecutorPlugin(AirflowPlugin):
    """The executor's health endpoint, its page, the navigation entry and the dashboard card."""

    name = NAME
    external_views = [EXTERNAL_VIEW] if AIRFLOW_V3 else []
    react_apps = [DASHBOARD_CARD] if AIRFLOW_V3 else []

    # A property, not the plain list Airflow's base declares: the app (FastAPI and Airflow's security
    # module) is built only when the api-server reads it, never in a task process loading plugins.
    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        if not AIRFLOW_V3:
            return []
        return [{"app": _app(), "url_prefix": PREFIX, "name": "AsyncLocalExecutor health"}]
