"""A throwaway PostgreSQL database for a sandbox: uniquely named, created (empty, or as a copy of a
template), then dropped with its contents.

By default the server on 127.0.0.1:5432, as user ``postgres`` with no password in the URL (libpq's
own sources, such as ``PGPASSWORD`` or ``~/.pgpass``, still apply); CREATE and DROP DATABASE go
through the first admin database that accepts a connection. The sandbox calls ``create()`` and
``drop()`` itself; a test that needs the database before the sandbox uses it as a context manager.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from harness.waits import SandboxError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PostgresDatabase"]


class PostgresDatabase:
    """A uniquely named PostgreSQL database that exists for the lifetime of the context."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 5432,
        user: str = "postgres",
        admin_databases: Sequence[str] = ("postgres", "test"),
        prefix: str = "airflow_sandbox",
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.admin_databases = tuple(admin_databases)
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self._created = False
        self._template = False

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.name}"

    def _admin_url(self, dbname: str) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{dbname}"

    @contextlib.contextmanager
    def _admin_connection(self) -> Iterator[sa.Connection]:
        errors: list[str] = []
        for dbname in self.admin_databases:
            # AUTOCOMMIT: CREATE/DROP DATABASE cannot run inside a transaction block.
            engine = sa.create_engine(
                self._admin_url(dbname),
                poolclass=NullPool,
                isolation_level="AUTOCOMMIT",
                connect_args={"connect_timeout": 10},
            )
            try:
                conn = engine.connect()
            except sa.exc.OperationalError as exc:
                errors.append(f"{dbname}: {str(exc.orig).strip()}")
                engine.dispose()
                continue
            try:
                yield conn
            finally:
                conn.close()
                engine.dispose()
            return
        raise SandboxError(f"cannot connect to postgresql admin database: {'; '.join(errors)}")

    def create(self, template: str | None = None) -> str:
        """Create the database: empty, or a copy of the database named ``template``."""
        copy = "" if template is None else f' TEMPLATE "{template}"'
        with self._admin_connection() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"{copy}'))
        self._created = True
        return self.url

    def make_template(self) -> None:
        """Let other databases be created as copies of this one, and nobody connect to it any more.

        A copy needs its template to have no connection; autovacuum does not connect to a database
        that allows none.
        """
        with self._admin_connection() as conn:
            conn.execute(
                sa.text(f'ALTER DATABASE "{self.name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
            )
        self._template = True

    def drop(self) -> None:
        if not self._created:
            return
        with self._admin_connection() as conn:
            if self._template:
                conn.execute(sa.text(f'ALTER DATABASE "{self.name}" WITH IS_TEMPLATE false'))
            # A connection left over by a killed process would make DROP DATABASE fail.
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": self.name},
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self._created = False

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drop()
