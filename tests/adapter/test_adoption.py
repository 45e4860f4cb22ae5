"""Whose workloads an executor holds (``adoption.owner_key``): its deployment's database and its team, not
its credentials. The handovers themselves, driven through the executor, are test_adoption_handover.py's.
"""

from __future__ import annotations

import dataclasses

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey

from async_local_executor.adapter.adoption import TaskRecord, UnknownRecord, owner_key


class Conf:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, section: str, key: str, fallback: str = "") -> str:
        assert (section, key) == ("database", "sql_alchemy_conn")
        return self.url


BASE = "postgresql+psycopg2://airflow:old@DB.example:5432/airflow"


@pytest.mark.parametrize(
    "same",
    [
        "postgresql+psycopg2://airflow:new@db.example:5432/airflow",  # a rotated password
        "postgresql+psycopg2://other:old@db.example:5432/airflow",  # a rotated user (an IAM token's)
        "postgresql://airflow:old@db.example/airflow",  # another driver, the default port
        "postgresql+psycopg://airflow:old@db.example:5432/airflow?sslmode=require",
    ],
)
def test_the_same_database_is_the_same_deployment_whatever_the_credentials_or_driver(same: str) -> None:
    assert owner_key(Conf(same), None) == owner_key(Conf(BASE), None)


@pytest.mark.parametrize(
    "other",
    [
        "postgresql+psycopg2://airflow:old@db2.example:5432/airflow",
        "postgresql+psycopg2://airflow:old@db.example:5433/airflow",
        "postgresql+psycopg2://airflow:old@db.example:5432/airflow2",
        "sqlite:////home/airflow/airflow.db",
    ],
)
def test_another_database_is_another_deployment(other: str) -> None:
    assert owner_key(Conf(other), None) != owner_key(Conf(BASE), None)


def test_teams_of_one_deployment_have_keys_of_their_own() -> None:
    keys = {owner_key(Conf(BASE), team) for team in (None, "team_a", "team_b")}
    assert len(keys) == 3
    assert "old" not in "".join(keys)


def test_a_record_carries_its_deadline_and_when_its_sigkill_is_due_once_its_stop_began() -> None:
    key = TaskInstanceKey("dag", "task", "run", 2, -1)
    launched = TaskRecord.at_launch(key, "ti-1", 20.0, wall=1000.0, boot=50.0)
    assert (launched.deadline, launched.kill_by) == (70.0, None)
    assert launched.timeout_left(60.0) == 10.0
    assert launched.timeout_left(75.0) == -5.0  # spent 5 s ago: the adopter's stop begins at once
    stopped = dataclasses.replace(launched, kill_by=78.0)
    assert TaskRecord.from_json(stopped.to_json()) == stopped
    line = launched.to_json()
    del line["kill_by"]  # a line written before the field
    assert TaskRecord.from_json(line) == launched
    for bad in ("soon", float("nan"), True):
        with pytest.raises(UnknownRecord, match="kill_by"):
            TaskRecord.from_json({**line, "kill_by": bad})
