"""The scheduler's stop handler, on Airflow 3 and on Airflow 2: the stand-in both majors' tests of where a
stop lands use (tests/adapter/test_stop_signals.py, tests/airflow2/test_executor.py), and the check that
each major's scheduler names its handler and its loop as adapter/stop_signals.py expects.
"""

from __future__ import annotations

from types import FrameType

from async_local_executor.adapter import stop_signals


class SchedulerStop:
    """Stands in for Airflow's scheduler job runner: its stop handler, by the name Airflow gives it
    (``SchedulerJobRunner._exit_gracefully``, which logs and raises ``SystemExit``).

    :attr stops: the signals it was called for, in order
    """

    def __init__(self) -> None:
        self.stops: list[int] = []

    def _exit_gracefully(self, signum: int, frame: FrameType | None) -> None:
        self.stops.append(signum)
        raise SystemExit(0)


def the_scheduler_names_its_stop_handler_and_its_loop_as_expected() -> None:
    """Renamed, the handler would no longer be held over (every stop as before), the loop no longer seen
    (every stop held until a heartbeat)."""
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    assert SchedulerJobRunner._exit_gracefully.__name__ == stop_signals.AIRFLOW_HANDLER
    assert callable(getattr(SchedulerJobRunner, stop_signals.LOOP))
