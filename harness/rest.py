"""The sandbox's client of Airflow's public REST API (``/api/v2``) on its own api-server.

By default the sandbox configures the simple auth manager with every request an admin request, so a
request carries no credentials. A sandbox with users of its own gives the client an admin's name and
password: it then gets a token from ``POST /auth/token`` and sends it with every call.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from harness.waits import SandboxError

__all__ = ["RestClient"]


class RestClient:
    """Calls on the api-server at ``api_url`` (always the sandbox's own ``http://127.0.0.1:<port>``)."""

    def __init__(self, api_url: str, credentials: tuple[str, str] | None = None) -> None:
        self.api_url = api_url
        self._credentials = credentials
        self._token: str | None = None

    def token(self, username: str, password: str) -> str:
        """A JWT for this user, from the auth manager's ``POST /auth/token``."""
        body = json.dumps({"username": username, "password": password}).encode()
        result = self._call("POST", "/auth/token", body, {"Content-Type": "application/json"}, 30.0)
        return str(result["access_token"])

    def api(self, method: str, path: str, body: object | None = None, timeout: float = 30.0) -> Any:
        """Call the public REST API (``path`` relative to ``/api/v2``) and return decoded JSON."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._credentials is not None:
            if self._token is None:
                self._token = self.token(*self._credentials)
            headers["Authorization"] = f"Bearer {self._token}"
        return self._call(method, f"/api/v2/{path.lstrip('/')}", data, headers, timeout)

    def health(self) -> dict[str, Any] | None:
        """The ``/api/v2/monitor/health`` document, or None while the api-server is not up."""
        try:
            result = self.anonymous("GET", "/api/v2/monitor/health", timeout=5.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, SandboxError):
            return None
        return result if isinstance(result, dict) else None

    def anonymous(self, method: str, path: str, timeout: float = 30.0) -> Any:
        """Call ``path`` (from the server's root) without credentials and return decoded JSON."""
        return self._call(method, path, None, {}, timeout)

    def _call(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> Any:
        # The URL is always our own http://127.0.0.1 api-server, never caller-supplied.
        request = urllib.request.Request(  # noqa: S310
            f"{self.api_url}{path}",
            data=data,
            method=method,
            headers={"Accept": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise SandboxError(f"{method} {path} failed with http {exc.code}: {detail}") from exc
        return json.loads(payload) if payload else None

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"dags/{_q(dag_id)}", {"is_paused": False})

    def create_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
        """Create a manual run with our ``run_id``; return the run_id the api-server reports."""
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        result = self.api("POST", f"dags/{_q(dag_id)}/dagRuns", body)
        return str(result["dag_run_id"])

    def clear(self, dag_id: str, run_id: str, task_id: str, map_indexes: Sequence[int]) -> None:
        """Clear some mapped task instances of a run (they run again), as the UI's Clear does."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "only_failed": False,
            "reset_dag_runs": True,
            "task_ids": [[task_id, i] for i in map_indexes],
        }
        self.api("POST", f"dags/{_q(dag_id)}/clearTaskInstances", body)

    def xcom(self, dag_id: str, run_id: str, task_id: str, *, key: str, map_index: int) -> Any:
        """Deserialized XCom value."""
        path = (
            f"dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}/xcomEntries/{_q(key)}"
            f"?map_index={map_index}&deserialize=true&stringify=false"
        )
        return self.api("GET", path)["value"]


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")
