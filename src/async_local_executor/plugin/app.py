"""The app the plugin mounts at ``/async-local-executor`` in Airflow's api-server.

- ``GET /health``: the verdict of the executors of this host, for anyone (Airflow's own
  ``/api/v2/monitor/health`` is unauthenticated too); no task names, no pids.
- ``GET /status``: everything ``async-local-executor status`` shows, for a user Airflow's auth manager
  lets see the Jobs view (the page that lists schedulers); 401 without a credential, 403 with an invalid
  one or without that permission.
- ``POST /control/{pause,resume,drain,resize}``: live control of the executors of this host
  (:mod:`~async_local_executor.ops.control`), for a user Airflow's auth manager lets edit every DAG of
  the team named (what an executor runs is every DAG's; a viewer may not); a JSON body only (FastAPI
  refuses any other with 422, and a cross-site form cannot send one), which names the team and the
  change. 200 once every running executor applied it, 202 if one had not within ``CONTROL_WAIT``
  seconds, 400 for bad input and 409 when none runs, nothing changed either way.
- ``GET /ui``: the executor page (the UI's "Executor" entry), and ``/static/``: its script, style,
  icons and the dashboard card's bundle, all shipped in the package (no build step).

Both documents come from :mod:`~async_local_executor.ops.overview`, over the status files of
``[async_local_executor] state_dir`` on the api-server's host. Reading them is file I/O, so the
handlers are plain functions, which FastAPI runs in its thread pool, off the server's event loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from async_local_executor.ops import control, overview, state_dir
from async_local_executor.ops.control import Control, ControlError, NotRunning
from async_local_executor.ops.status_read import read_all

STATIC = Path(str(resources.files("async_local_executor.plugin") / "static"))
# The page runs no inline script and loads nothing from elsewhere; it may be framed by Airflow's UI only.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'self'"
NO_STORE = {"Cache-Control": "no-store"}
CONTROL_WAIT = 10.0  # seconds a control request waits for the executors to apply it (their heartbeat)


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


def _user() -> Any:
    """The dependency that gives the authenticated user (401 without a credential)."""
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def _may_control(user: Any, team: str | None) -> bool:
    """Whether Airflow's auth manager lets ``user`` edit every DAG of ``team`` (none: of the deployment):
    what an executor runs is every DAG's. Simple auth manager: a user, op or admin, not a viewer; FAB:
    ``can edit on DAGs``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(
        get_auth_manager().is_authorized_dag(method="PUT", details=DagDetails(team_name=team), user=user)
    )


class ControlBody(BaseModel):
    """What one control request changes (each action reads the fields it needs)."""

    team: str | None = Field(None, description="the team whose executors to act on; none: those without one")
    deadline: float | None = Field(None, description="drain: seconds from now, then on_stop applies")
    parallelism: int | None = Field(None, description="resize: the executor-wide limit")
    queues: dict[str, int] = Field(default_factory=dict, description="resize: limits of named queues")


Action = Literal["pause", "resume", "drain", "resize"]


def _edit(
    action: Action, body: ControlBody, by: str
) -> Callable[[int, Mapping[str, int]], Callable[[Control], Control]]:
    at = time.time()
    if action == "pause":
        return lambda _p, _q: control.pause(by, at)
    if action == "resume":
        return lambda _p, _q: control.resume(by, at)
    if action == "drain":
        return lambda _p, _q: control.drain(by, at, body.deadline)
    if body.parallelism is None and not body.queues:
        raise ControlError("resize needs parallelism or queues")
    return lambda configured, queues: control.resize(
        by,
        at,
        parallelism=body.parallelism,
        queues=body.queues,
        configured_parallelism=configured,
        configured_queues=queues,
    )


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

    @app.post(
        "/control/{action}", summary="Pause, resume, drain or resize this host's executors (authenticated)"
    )
    def change(action: Action, body: ControlBody, user: Any = Depends(_user())) -> JSONResponse:  # noqa: B008
        if not _may_control(user, body.team):
            return JSONResponse(
                {"detail": "changing the executor needs the permission to edit every DAG"},
                status_code=403,
                headers=NO_STORE,
            )
        try:
            done = control.request(
                where(), body.team, _edit(action, body, str(user.get_name())), timeout=CONTROL_WAIT
            )
        except NotRunning as exc:
            return JSONResponse({"detail": str(exc)}, status_code=409, headers=NO_STORE)
        except ControlError as exc:
            return JSONResponse({"detail": f"{exc}; nothing was changed"}, status_code=400, headers=NO_STORE)
        document = {
            "control": done.control.to_json(),
            "said": done.control.describe(),
            "applied": done.applied,
            "pending": list(done.pending),
        }
        return JSONResponse(document, status_code=202 if done.pending else 200, headers=NO_STORE)

    @app.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(
            STATIC / "executor.html",
            media_type="text/html",
            headers={"Content-Security-Policy": PAGE_POLICY, **NO_STORE},
        )

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
