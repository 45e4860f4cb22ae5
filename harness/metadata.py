"""Read-only access to a sandbox's metadata database: DAG parsing, run states, task instances, callbacks.

Plain SQL through SQLAlchemy, no Airflow models: the same queries read the SQLite file and a
PostgreSQL database, and the harness needs no Airflow import of its own.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from harness.waits import SandboxError

__all__ = ["CallbackRow", "MetadataDB", "TaskInstanceRow"]


@dataclass(frozen=True)
class TaskInstanceRow:
    task_id: str
    map_index: int
    state: str | None
    try_number: int
    start_date: datetime | None
    end_date: datetime | None
    queued_dttm: datetime | None
    duration: float | None


@dataclass(frozen=True)
class CallbackRow:
    """One row of the ``callback`` table, joined with its ``deadline`` row when there is one."""

    id: str
    type: str
    state: str | None
    fetch_method: str
    path: str | None
    output: str | None
    created_at: datetime | None
    data: dict[str, Any]
    deadline_time: datetime | None
    deadline_missed: bool | None


class MetadataDB:
    """Queries on the metadata DB at ``url``; the engine is made on first use and after :meth:`dispose`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: sa.Engine | None = None

    @property
    def engine(self) -> sa.Engine:
        """Read-side engine on the metadata DB (NullPool: holds no connection between calls)."""
        if self._engine is None:
            connect_args: dict[str, Any] = {}
            if self.url.startswith("sqlite"):
                connect_args["timeout"] = 30
            self._engine = sa.create_engine(self.url, poolclass=NullPool, connect_args=connect_args)
        return self._engine

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        """Run read-only SQL against the metadata DB and return plain tuples."""
        with self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(sql), params)]

    def dag_is_parsed(self, dag_id: str) -> bool:
        rows = self.query(
            "SELECT d.is_stale FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
            "WHERE d.dag_id = :dag_id",
            dag_id=dag_id,
        )
        return any(not row[0] for row in rows)

    def import_errors(self) -> list[tuple[str, str]]:
        return [(str(r[0]), str(r[1])) for r in self.query("SELECT filename, stacktrace FROM import_error")]

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id",
            dag_id=dag_id,
            run_id=run_id,
        )
        return None if not rows else rows[0][0]

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskInstanceRow]:
        rows = self.query(
            "SELECT task_id, map_index, state, try_number, start_date, end_date, queued_dttm, "
            "duration FROM task_instance WHERE dag_id = :dag_id AND run_id = :run_id "
            "ORDER BY task_id, map_index",
            dag_id=dag_id,
            run_id=run_id,
        )
        return [
            TaskInstanceRow(
                task_id=str(r[0]),
                map_index=int(r[1]),
                state=r[2],
                try_number=int(r[3] or 0),
                start_date=_as_datetime(r[4]),
                end_date=_as_datetime(r[5]),
                queued_dttm=_as_datetime(r[6]),
                duration=None if r[7] is None else float(r[7]),
            )
            for r in rows
        ]

    def callbacks(self, dag_id: str | None = None, run_id: str | None = None) -> list[CallbackRow]:
        """Rows of the ``callback`` table; with dag_id/run_id only deadline callbacks of that run."""
        sql = (
            "SELECT c.id, c.type, c.state, c.fetch_method, c.data, c.output, c.created_at, "
            "d.deadline_time, d.missed FROM callback c "
            "LEFT JOIN deadline d ON d.callback_id = c.id "
            "LEFT JOIN dag_run r ON r.id = d.dagrun_id"
        )
        params: dict[str, Any] = {}
        clauses: list[str] = []
        if dag_id is not None:
            clauses.append("r.dag_id = :dag_id")
            params["dag_id"] = dag_id
        if run_id is not None:
            clauses.append("r.run_id = :run_id")
            params["run_id"] = run_id
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY c.created_at"
        result: list[CallbackRow] = []
        for r in self.query(sql, **params):
            data = _json_column(r[4])
            path = data.get("path")
            result.append(
                CallbackRow(
                    id=_uuid_text(r[0]),
                    type=str(r[1]),
                    state=r[2],
                    fetch_method=str(r[3]),
                    path=str(path) if path is not None else None,
                    output=r[5],
                    created_at=_as_datetime(r[6]),
                    data=data,
                    deadline_time=_as_datetime(r[7]),
                    deadline_missed=_as_bool(r[8]),
                )
            )
        return result


def _as_datetime(value: object) -> datetime | None:
    # SQLite hands back text, PostgreSQL aware datetimes; Airflow stores UTC in both.
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = datetime.fromisoformat(value)
    else:
        raise SandboxError(f"unexpected datetime value {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _as_bool(value: object) -> bool | None:
    return None if value is None else bool(value)


def _unwrap_serialized(value: Any) -> Any:
    # ExtendedJSON columns hold BaseSerialization output: {"__type": ..., "__var": ...} wrappers.
    if isinstance(value, dict):
        if "__var" in value and "__type" in value:
            return _unwrap_serialized(value["__var"])
        return {str(k): _unwrap_serialized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_serialized(v) for v in value]
    return value


def _json_column(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    loaded = json.loads(value) if isinstance(value, (str, bytes)) else value
    unwrapped = _unwrap_serialized(loaded)
    return unwrapped if isinstance(unwrapped, dict) else {"value": unwrapped}


def _uuid_text(value: object) -> str:
    # PostgreSQL returns a UUID (or canonical text), SQLite the 32-char hex form.
    if isinstance(value, uuid.UUID):
        return str(value)
    text = str(value)
    with contextlib.suppress(ValueError):
        return str(uuid.UUID(text))
    return text
