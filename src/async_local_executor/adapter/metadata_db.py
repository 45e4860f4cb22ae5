"""What the adapter reads and writes in Airflow's metadata database itself, beside the scheduler.

Rule: every function here blocks on the database (and may wait on a row lock the scheduler holds), so
none runs on the scheduler's thread; each opens a session or connection of its own and never touches
the scheduler's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any


def airflow2_log_path(key: Any) -> str | None:
    """Airflow 2: a task try's log file under ``[logging] base_log_folder``, rendered as Airflow does.

    Reads the run's log template from the database, so it runs off the scheduler's thread.
    """
    from airflow.utils.log.file_task_handler import FileTaskHandler
    from airflow.utils.session import create_session

    render = getattr(FileTaskHandler, "_render_filename_db_access")  # noqa: B009 - Airflow 2 only
    with create_session() as session:
        _, _, str_tpl, filename = render(ti=key, try_number=key.try_number, session=session)
    if filename:
        return str(filename)
    if str_tpl:  # a template of the oldest kind, with {placeholders}: only the key's fields fit here
        return str(str_tpl).format(
            dag_id=key.dag_id, task_id=key.task_id, run_id=key.run_id, try_number=key.try_number
        )
    return None


def airflow2_audit(key: Any, event: str, extra: str) -> None:
    """Airflow 2: write an audit-log record for a task try ourselves.

    Airflow 2.11.2 saves executors' records (``log_task_event``) with ``bulk_save_objects`` over a
    generator, which SQLAlchemy 1.4 silently drops: none reaches the table. A database write, so it
    runs off the scheduler's thread.
    """
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        session.add(Log(event=event, task_instance=key, extra=extra))


def restarting_task_instances(keys: Collection[Any]) -> set[Any]:
    """Which of these task-instance keys are ``restarting`` in the database now (Airflow 3).

    Read on a connection of its own: the scheduler calls this inside ``process_executor_events``, and
    its own session must not be committed or closed there (that is the bug this reading works around).
    """
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    where = TaskInstance.filter_for_tis(keys)
    if where is None or settings.engine is None:
        return set()
    query = select(TaskInstance.dag_id, TaskInstance.task_id, TaskInstance.run_id, TaskInstance.map_index)
    query = query.where(where, TaskInstance.state == TaskInstanceState.RESTARTING)
    with settings.engine.connect() as connection:
        rows = {tuple(row) for row in connection.execute(query)}
    return {key for key in keys if (key.dag_id, key.task_id, key.run_id, key.map_index) in rows}


@dataclass(frozen=True)
class ExecutorScope:
    """Which task instance rows are this executor's: those naming it, and unnamed ones if it is the default.

    The scheduler's job id in ``queued_by_job_id`` is shared by every executor (and team) it runs, so a
    row queued by this scheduler may be another executor's.
    """

    names: frozenset[str]
    """What a task's ``executor=`` may say to mean this executor (alias, module path, class name)."""
    default: bool
    """Whether rows naming no executor are this one's: it is the global default and no team has one."""

    @classmethod
    def of(cls, executor: Any) -> ExecutorScope:
        """The scope of a running Airflow 3 executor instance."""
        from airflow.configuration import conf
        from airflow.executors.executor_loader import ExecutorLoader

        name = getattr(executor, "name", None)
        names = set()
        if name is not None:
            names = {n for n in (name.alias, name.module_path, name.module_path.rsplit(".", 1)[-1]) if n}
        # With teams, a row naming no executor is its team's default: only the scheduler resolves that.
        multi_team = conf.getboolean("core", "multi_team", fallback=False)
        default = (
            name is not None
            and not multi_team
            and getattr(executor, "team_name", None) is None
            and ExecutorLoader.get_default_executor_name() == name
        )
        return cls(frozenset(names), default)


@dataclass(frozen=True)
class Requeued:
    """What :func:`requeue_unreachable` did with each key it was given (keys it found nothing for are in none)."""

    scheduled: set[Any]  # was queued: put back to scheduled, for the same try
    reset: set[Any]  # was running (or restarting): put to no state, so the scheduler runs a new try
    foreign: dict[Any, str]  # left as it was: its row is another executor's, named here


def requeue_unreachable(keys: Collection[Any], job_id: int | str, scope: ExecutorScope) -> Requeued:
    """Put back those of ``keys`` whose task instance no workload can run any more (Airflow 3).

    Each key's workload ended and its task instance holds an id that workload did not have: a clear that
    read a stale row wrote only a new id onto it. A row still ``queued`` for that try by job ``job_id``
    goes back to ``scheduled``, as the scheduler does with a task stuck in queued past ``[scheduler]
    task_queued_timeout`` (``_reschedule_stuck_task``). A row ``running`` for that try (the stale clear
    came after the workload had started it; the api-server then refused its heartbeat or its state) goes
    to no state, as the scheduler does when a cleared running task's workload ends, so it runs as a new
    try; without it the row would stay running until the scheduler's heartbeat timeout failed it. Each row is updated
    only while it is still in that state for the same try by the same job and is this executor's
    (``scope``), in a transaction of its own on a connection of its own. Blocking (it may wait on a row
    lock the scheduler holds): never call it on the scheduler's thread.
    """
    from datetime import datetime, timezone

    from airflow import settings
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import and_, false, or_, select, true, update

    done = Requeued(set(), set(), {})
    if not keys or settings.engine is None:
        return done
    table = TaskInstance.__table__
    unnamed = and_(table.c.executor.is_(None), true() if scope.default else false())
    ours = or_(table.c.executor.in_(sorted(scope.names)), unnamed)
    queued = (TaskInstanceState.QUEUED.value,)
    started = (TaskInstanceState.RUNNING.value, TaskInstanceState.RESTARTING.value)
    for key in keys:
        same_try = and_(
            table.c.dag_id == key.dag_id,
            table.c.task_id == key.task_id,
            table.c.run_id == key.run_id,
            table.c.map_index == key.map_index,
            table.c.try_number == key.try_number,
            table.c.state.in_(queued + started),
            table.c.queued_by_job_id == job_id,
        )
        to_scheduled = (
            update(table)
            .where(same_try, ours, table.c.state.in_(queued))
            .values(
                state=TaskInstanceState.SCHEDULED.value,
                queued_dttm=None,
                queued_by_job_id=None,
                scheduled_dttm=datetime.now(timezone.utc),
            )
        )
        # The stale clear set max_tries from the try it read, the one before this, and a clear since
        # (running to restarting) leaves it: one more keeps the retries the scheduler's own reset of a
        # cleared running task (try_number + retries) would give.
        to_none = (
            update(table)
            .where(same_try, ours, table.c.state.in_(started))
            .values(state=None, max_tries=table.c.max_tries + 1)
        )
        with settings.engine.begin() as connection:
            if connection.execute(to_scheduled).rowcount:
                done.scheduled.add(key)
                continue
            if connection.execute(to_none).rowcount:
                done.reset.add(key)
                continue
            for (executor,) in connection.execute(select(table.c.executor).where(same_try)):
                done.foreign[key] = executor or "the default executor"
    return done
