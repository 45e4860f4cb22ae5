"""The scheduler heartbeats the database records: every beat, where a sampler sees only some.

On a real SQLite file and a real PostgreSQL database, each with a table of the shape of Airflow's
``job`` (the columns the trigger reads) and a ``task_instance`` for the sampler; no Airflow runs here. The suite's runs use the same record on
Airflow's own table (tests/bench/test_smoke.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from benchmarks.probes import HeartbeatRecord, LoopProbe
from harness.postgres import PostgresDatabase

T0 = datetime(2026, 12, 6, 1, 0, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        yield sa.create_engine(f"sqlite:///{tmp_path / 'airflow.db'}", poolclass=NullPool)
        return
    with PostgresDatabase() as database:
        engine = sa.create_engine(database.url, poolclass=NullPool)
        yield engine
        engine.dispose()


def _beat(conn: sa.Connection, job: int, at: datetime) -> None:
    conn.execute(sa.text("UPDATE job SET latest_heartbeat = :at WHERE id = :id"), {"at": at, "id": job})


def test_every_beat_is_recorded_where_the_samples_miss_the_ones_between(engine: sa.Engine) -> None:
    stamp = "TIMESTAMP WITH TIME ZONE" if engine.dialect.name == "postgresql" else "TIMESTAMP"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE job (id INTEGER PRIMARY KEY, job_type VARCHAR(30), latest_heartbeat {stamp})"
            )
        )
        # The sampler also counts the running task instances.
        conn.execute(sa.text("CREATE TABLE task_instance (state VARCHAR(20))"))
        conn.execute(
            sa.text("INSERT INTO job VALUES (1, 'SchedulerJob', :at), (2, 'TriggererJob', :at)"), {"at": T0}
        )

    def query(sql: str) -> list[tuple[object, ...]]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(sql))]

    probe = LoopProbe(query, HeartbeatRecord(engine))
    assert probe.record is not None
    probe.record.install()
    probe.record.install()  # installing twice records each beat once
    probe._sample(0.0)
    # The scheduler beats every second for four seconds; the sampler runs only before and after.
    with engine.begin() as conn:
        for k in range(1, 5):
            _beat(conn, 1, T0 + timedelta(seconds=k))
            # Another job's beats are not the scheduler's.
            _beat(conn, 2, T0 + timedelta(seconds=k, milliseconds=500))
    probe._sample(1.0)
    probe.recorded = probe.record.beats()
    probe.ended_at = (T0 + timedelta(seconds=4)).timestamp()

    assert probe.recorded == [(T0 + timedelta(seconds=k)).timestamp() for k in range(1, 5)]
    assert probe.gaps(sampled_only=True) == [4.0, 0.0]
    assert probe.gaps() == [1.0, 1.0, 1.0, 1.0, 0.0]
