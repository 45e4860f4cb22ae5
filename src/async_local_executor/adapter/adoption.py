"""Running task instances across a scheduler restart: what a stop records of each, and which ones a
successor holds until Airflow offers them for adoption.

A stopping executor hands each running task workload over (``on_stop = handover``) with what names its
task instance (:func:`handover_info`). The next executor on the host holds every workload handed over
that still runs (``ops/recovery.py`` says which) from its start, and Airflow offers their task instances
through ``try_adopt_task_instances``: after a stop at once, after a crash once the dead scheduler's
job is older than ``[scheduler] scheduler_health_check_threshold``, at the next orphan check.

Rule: a held workload is supervised (it holds a slot, its timeout and stops apply) from the start, and
its end becomes Airflow's event only once its task instance was offered and claimed: until then, an
end is kept for that moment. A task instance offered that no held workload runs is refused, and Airflow
resets it as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow.models.taskinstancekey import TaskInstanceKey

from async_local_executor.core.outcome import Outcome

log = logging.getLogger(__name__)

INFO_VERSION = 1  # what a record written by this version holds; another version's is refused cleanly


def handover_info(key: TaskInstanceKey, ti_id: str | None, launched: float) -> dict[str, object]:
    """What the journal records of a handed-over task workload, for its successor to adopt it by."""
    return {
        "v": INFO_VERSION,
        "dag_id": key.dag_id,
        "task_id": key.task_id,
        "run_id": key.run_id,
        "try_number": key.try_number,
        "map_index": key.map_index,
        "ti_id": ti_id,
        "launched": launched,
    }


class UnknownRecord(ValueError):
    """A handover record this version cannot read (written by another version, or damaged)."""


def key_of(info: Mapping[str, object]) -> TaskInstanceKey:
    """The task instance key a handover record names.

    :raises UnknownRecord: it names none this version can read
    """
    if info.get("v") != INFO_VERSION:
        raise UnknownRecord(f"record version {info.get('v')!r}, this version reads {INFO_VERSION}")
    try:
        dag_id, task_id, run_id = (info[name] for name in ("dag_id", "task_id", "run_id"))
        try_number, map_index = info["try_number"], info["map_index"]
    except KeyError as exc:
        raise UnknownRecord(f"no {exc.args[0]}") from None
    if not all(isinstance(part, str) for part in (dag_id, task_id, run_id)):
        raise UnknownRecord("dag_id, task_id and run_id must be strings")
    if type(try_number) is not int or type(map_index) is not int:
        raise UnknownRecord("try_number and map_index must be integers")
    return TaskInstanceKey(str(dag_id), str(task_id), str(run_id), try_number, map_index)


def launched_at(info: Mapping[str, object]) -> float | None:
    value = info.get("launched")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Held:
    """One handed-over workload this executor supervises, until its task instance is claimed."""

    key: TaskInstanceKey
    pid: int
    label: str
    claimed: bool = False
    ended: Outcome | None = field(default=None, repr=False)  # its end, while unclaimed


class Holding:
    """The held workloads by task instance key. Scheduler thread only."""

    def __init__(self) -> None:
        self._held: dict[TaskInstanceKey, Held] = {}

    def hold(self, held: Held) -> None:
        self._held[held.key] = held

    def is_held(self, key: object) -> bool:
        """Whether ``key``'s end is not Airflow's yet: held, and its task instance not claimed."""
        held = self._held.get(key) if isinstance(key, TaskInstanceKey) else None
        return held is not None and not held.claimed

    def keep_end(self, key: TaskInstanceKey, outcome: Outcome) -> None:
        """An unclaimed workload ended: its end waits for its task instance to be offered."""
        self._held[key].ended = outcome

    def claim(self, key: TaskInstanceKey) -> Held | None:
        """Claim the held workload of an offered task instance; None when none runs it."""
        held = self._held.get(key)
        if held is None or held.claimed:
            return None
        held.claimed = True
        return held

    def forget(self, key: object) -> None:
        """Its end was given to Airflow."""
        if isinstance(key, TaskInstanceKey):
            self._held.pop(key, None)

    def waiting(self) -> list[Held]:
        """The ones not claimed yet."""
        return [held for held in self._held.values() if not held.claimed]
