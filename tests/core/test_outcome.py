"""What an end means: classify(), internal_error() and with_cleanup() as pure functions, no processes."""

from __future__ import annotations

import signal

import pytest

from async_local_executor.core.errors import ChildLost, LaunchError
from async_local_executor.core.outcome import (
    Cleanup,
    Outcome,
    OutcomeKind,
    Times,
    classify,
    describe_status,
    internal_error,
    with_cleanup,
)


def test_a_clean_exit_is_ok_with_no_reason() -> None:
    outcome = classify("k", 0, None)
    assert outcome == Outcome("k", OutcomeKind.EXITED, 0, "")
    assert outcome.ok


def test_a_nonzero_exit_is_exited_and_not_ok() -> None:
    outcome = classify("k", 3, None)
    assert outcome == Outcome("k", OutcomeKind.EXITED, 3, "exited with code 3")
    assert not outcome.ok


def test_a_signal_we_did_not_send_is_signalled() -> None:
    outcome = classify("k", -signal.SIGKILL, None)
    assert outcome == Outcome("k", OutcomeKind.SIGNALLED, -signal.SIGKILL, "killed by SIGKILL")
    assert not outcome.ok


@pytest.mark.parametrize(
    ("status", "how"),
    [
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (0, "exited with code 0"),
    ],
)
def test_any_end_of_a_workload_we_stopped_is_terminated(status: int, how: str) -> None:
    # Even a clean exit: it exited because we asked, so it did not finish its work.
    outcome = classify("k", status, "revoked")
    assert outcome == Outcome("k", OutcomeKind.TERMINATED, status, f"revoked: terminated ({how})")
    assert not outcome.ok


def test_a_failed_launch_names_its_cause_even_if_we_were_stopping_it() -> None:
    error = LaunchError("cannot exec /nonexistent/python3: No such file")
    for stop_reason in (None, "revoked"):
        assert classify("k", error, stop_reason) == Outcome(
            "k", OutcomeKind.LAUNCH_FAILED, reason="cannot exec /nonexistent/python3: No such file"
        )


def test_an_exit_whose_status_is_gone_is_lost() -> None:
    for stop_reason in (None, "revoked"):
        assert classify("k", ChildLost("reaped elsewhere"), stop_reason) == Outcome(
            "k", OutcomeKind.LOST, reason="reaped elsewhere"
        )


def test_a_workload_that_never_got_a_process_is_not_started_for_the_stop_reason() -> None:
    assert classify("k", None, "executor shut down") == Outcome(
        "k", OutcomeKind.NOT_STARTED, reason="executor shut down"
    )


def test_classify_leaves_the_times_to_the_caller() -> None:
    assert classify("k", 0, None).times is None
    assert Outcome("k", OutcomeKind.EXITED, 0, times=Times(1.0, 2.0, 3.0)).ok


@pytest.mark.parametrize(("launched", "kind"), [(False, OutcomeKind.LAUNCH_FAILED), (True, OutcomeKind.LOST)])
def test_an_internal_error_is_a_failed_launch_before_a_process_and_lost_after(
    launched: bool, kind: OutcomeKind
) -> None:
    outcome = internal_error("k", RuntimeError("bug"), launched=launched)
    assert outcome == Outcome("k", kind, reason="internal error: RuntimeError('bug')")


def test_an_unknown_signal_is_named_by_number() -> None:
    assert describe_status(-200) == "killed by signal 200"


@pytest.mark.parametrize(
    ("outcome", "cleanup", "reason"),
    [
        # No cgroup: the outcome as it was.
        (Outcome("k", OutcomeKind.EXITED, 1, "exited with code 1"), None, "exited with code 1"),
        # An OOM kill names the limit, or says out of memory when there was none.
        (
            Outcome("k", OutcomeKind.SIGNALLED, -9, "killed by SIGKILL"),
            Cleanup(oom_kills=1, memory_limit=1 << 20),
            "killed by the kernel: memory limit 1 MiB exceeded (killed by SIGKILL)",
        ),
        (Outcome("k", OutcomeKind.LOST), Cleanup(oom_kills=2), "killed by the kernel: out of memory"),
        # Leftovers killed are said for a failure only: a clean exit keeps its empty reason.
        (
            Outcome("k", OutcomeKind.EXITED, 2, "exited with code 2"),
            Cleanup(leftovers=3, killed=3),
            "exited with code 2; 3 leftover processes killed",
        ),
        (Outcome("k", OutcomeKind.EXITED, 0), Cleanup(leftovers=3, killed=3), ""),
    ],
)
def test_what_a_cgroup_says_goes_into_the_outcome(
    outcome: Outcome, cleanup: Cleanup | None, reason: str
) -> None:
    result = with_cleanup(outcome, cleanup)
    assert (result.reason, result.cleanup) == (reason, cleanup)
    assert (result.kind, result.returncode) == (outcome.kind, outcome.returncode)
