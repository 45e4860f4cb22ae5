"""The comparison of a home copied from a template (harness/templates.py) with one ``airflow db migrate``
made, for both Airflow majors' tests of it (tests/e2e and tests/airflow2 ``test_home_template.py``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from harness.sandbox import AirflowSandbox

# Lines of the generated airflow.cfg that Airflow fills with fresh random values (the last: Airflow 2's).
RANDOM_OPTIONS = ("secret_key", "jwt_secret", "internal_api_secret_key")
POOL = {"AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": "77"}


def contents(sandbox: AirflowSandbox) -> dict[str, Any]:
    """Every table's columns and rows; times (when a row was written) left out."""
    found: dict[str, Any] = {}
    inspector = sa.inspect(sandbox.engine)
    for table in sorted(inspector.get_table_names()):
        columns = [(c["name"], str(c["type"])) for c in inspector.get_columns(table)]
        timeless = [i for i, (_, kind) in enumerate(columns) if "TIME" not in kind and "DATE" not in kind]
        rows = sandbox.query(f'SELECT * FROM "{table}"')  # noqa: S608 - names from the database itself
        found[table] = (columns, sorted(repr([row[i] for i in timeless]) for row in rows))
    return found


def configuration(sandbox: AirflowSandbox) -> list[str]:
    text = sandbox.airflow_cfg_path.read_text().replace(str(sandbox.home), "$AIRFLOW_HOME")
    return [line for line in text.splitlines() if line.partition(" = ")[0] not in RANDOM_OPTIONS]


def check_copied_equals_migrated(kind: type[AirflowSandbox], database: str) -> None:
    made: list[AirflowSandbox] = []

    def prepared(**options: Any) -> AirflowSandbox:
        sandbox = kind(database=database, progress=None, **options)
        made.append(sandbox)
        sandbox.prepare()
        return sandbox

    try:
        prepared()  # a template of the default kind, made or found
        copied = prepared(extra_config=POOL)
        migrated = prepared(extra_config=POOL, template=False)
        assert copied.query("SELECT slots FROM slot_pool") == [(77,)]
        assert contents(copied) == contents(migrated)
        assert configuration(copied) == configuration(migrated)
    finally:
        for sandbox in made:
            sandbox.stop()
