"""Homes migrated once per process: each new sandbox's metadata database and airflow.cfg are copied from one.

``airflow db migrate`` on an empty database writes the same tables and rows for every deployment of one
Airflow, except where it reads an option of :data:`MIGRATE_READS` (the default pool's size, the log
templates it records). A template is therefore made once per kind of home: the sandbox class, its
Python (so its Airflow), its database kind (a SQLite file, or a PostgreSQL database, copied with
``CREATE DATABASE ... TEMPLATE``) and the values those options have in its environment. The
``airflow.cfg`` Airflow generates on that first command holds its defaults with the home's path in
them: the template's file, with its home's path replaced by the new one's, is the file the new home
would have got, but for the secrets Airflow draws at random for it (the sandbox's environment sets its
own for those Airflow uses; the rest, such as Airflow 2's internal API key, no sandbox uses).

Rule: a copied home holds what ``airflow db migrate`` would have left there; a database given by URL
(made by the caller, perhaps for more than Airflow) is migrated in place as before. Templates live
until this process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from harness.postgres import PostgresDatabase

if TYPE_CHECKING:
    from harness.lifecycle import SandboxLifecycle

__all__ = ["MIGRATE_READS", "Template", "key_of", "template_for"]

# What `airflow db migrate` writes into a new database from the configuration (Airflow 2.10 to 3.3:
# airflow.utils.db's add_default_pool_if_not_exists, synchronize_log_template and, on Airflow 2,
# create_default_connections, which `db migrate` skips on a new database).
MIGRATE_READS: Final[tuple[str, ...]] = (
    "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT",
    "AIRFLOW__LOGGING__LOG_FILENAME_TEMPLATE",
    "AIRFLOW__ELASTICSEARCH__LOG_ID_TEMPLATE",
)
SQLITE_FILE: Final[str] = "airflow.db"
CONFIG_FILE: Final[str] = "airflow.cfg"


@dataclass(frozen=True)
class Key:
    """What makes two homes' migrated databases the same."""

    kind: type[SandboxLifecycle]
    python: Path
    database: str
    options: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Template:
    """A home migrated once, never started: its database and airflow.cfg, to copy."""

    home: Path
    postgres: PostgresDatabase | None

    def copy_into(self, home: Path, postgres: PostgresDatabase | None) -> None:
        """Give ``home`` (and ``postgres``, a database not created yet) what migrating them would have."""
        if postgres is not None:
            assert self.postgres is not None, "a PostgreSQL home copies a PostgreSQL template"
            postgres.create(template=self.postgres.name)
        else:
            shutil.copyfile(self.home / SQLITE_FILE, home / SQLITE_FILE)
        generated = (self.home / CONFIG_FILE).read_text()
        target = home / CONFIG_FILE
        if not target.exists():  # an "empty" airflow.cfg stays empty
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(generated.replace(str(self.home), str(home)))

    def remove(self) -> None:
        if self.postgres is not None:
            self.postgres.drop()
        shutil.rmtree(self.home, ignore_errors=True)


_made: dict[Key, Template] = {}
_lock = threading.Lock()


def key_of(sandbox: SandboxLifecycle) -> Key | None:
    """The kind of home ``sandbox`` is, or None when its database is not one a template can give."""
    if sandbox.sql_alchemy_conn.startswith("sqlite:///"):
        database = "sqlite"
    elif sandbox.owns_postgres:
        database = "postgres"
    else:
        return None
    env = sandbox.env
    options = tuple((name, env[name]) for name in MIGRATE_READS if name in env)
    return Key(type(sandbox), sandbox.python, database, options)


def template_for(sandbox: SandboxLifecycle) -> Template:
    """The template for ``sandbox``'s kind of home, migrated now if this process has none yet."""
    key = key_of(sandbox)
    if key is None:
        raise ValueError(f"no template gives a database at {sandbox.sql_alchemy_conn}")
    with _lock:
        found = _made.get(key)
        if found is None:
            found = _made[key] = _migrate(key)
    return found


def _migrate(key: Key) -> Template:
    made = key.kind(
        home=tempfile.mkdtemp(prefix="airflow-template-"),
        database=key.database,
        python=key.python,
        extra_config=dict(key.options),
        template=False,
        progress=None,
    )
    try:
        made.prepare()
        if made.postgres is not None:
            made.postgres.make_template()
    except BaseException:
        made.stop(keep_home=True)
        raise
    return Template(made.home, made.postgres)


@atexit.register
def _remove_all() -> None:
    with _lock:
        for template in _made.values():
            template.remove()
        _made.clear()
