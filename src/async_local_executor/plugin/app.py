"""The app the plugin mounts at ``/async-local-executor`` in Airflow's api-server.

- ``GET /health``: the verdict of the executors of this host, for anyone (Airflow's own
  ``/api/v2/monitor/health`` is unauthenticated too); no task names, no pids.
- ``GET /status``: everything ``async-local-executor status`` shows, for a user Airflow's auth manager
  lets see the Jobs view (the page that lists schedulers); 401 without a credential, 403 with an invalid
  one or without that permission.
- ``GET /ui``: the executor page (the UI's "Executor" entry), and ``/static/``: its script, style,
  icons and the dashboard card's bundle, all shipped in the package (no build step).

Both documents come from :mod:`~async_local_executor.ops.overview`, over the status files of
``[async_local_executor] state_dir`` on the api-server's host. Reading them is file I/O, so the
handlers are plain functions, which FastAPI runs in its thread pool, off the server's event loop.
"""

from __future__ import annotations

import functools
import time
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from async_local_executor.ops import overview, state_dir
from async_local_executor.ops.status_read import read_all

STATIC = Path(str(resources.files("async_local_executor.plugin") / "static"))
# The page runs no inline script and loads nothing from elsewhere; it may be framed by Airflow's UI only.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'self'"
NO_STORE = {"Cache-Control": "no-store"}


@functools.cache
def _hostname() -> str:
    """Airflow's name for this host, as the executor records it; asked once ([core] hostname_callable
    may be any callable, a DNS lookup say), not on every request of a load balancer."""
    from airflow.utils.net import get_hostname

    return str(get_hostname())  # type: ignore[no-untyped-call]


def _viewer() -> Any:
    """The dependency that lets through a user allowed to see Airflow's Jobs view."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view

    return requires_access_view(AccessView.JOBS)


def create_app(directory: Path | None = None) -> FastAPI:
    """:param directory: the state directory to read; default: the one Airflow's configuration names"""
    app = FastAPI(
        title="AsyncLocalExecutor health",
        description="The health and status of the AsyncLocalExecutor instances on this host.",
        version="1",
    )

    def where() -> Path:
        return directory if directory is not None else state_dir.from_airflow_config()

    @app.get("/health", summary="The verdict of this host's executors, for monitors and load balancers")
    def health() -> JSONResponse:
        document = overview.health(read_all(where()), _hostname(), time.time())
        return JSONResponse(document, headers=NO_STORE)

    @app.get(
        "/status",
        summary="Everything the status command shows (authenticated)",
        dependencies=[Depends(_viewer())],
    )
    def status() -> JSONResponse:
        folder = where()
        document = overview.status(read_all(folder), _hostname(), time.time(), folder)
        return JSONResponse(document, headers=NO_STORE)

    @app.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(
            STATIC / "executor.html",
            media_type="text/html",
            headers={"Content-Security-Policy": PAGE_POLICY, **NO_STORE},
        )

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
