"""What the health endpoint and the dashboard say about the executors of this host, from their status files.

Two documents from one reading of the state directory (:func:`~async_local_executor.ops.status_read.read_all`):
:func:`health`, for anyone (a load balancer, a monitor), in the shape of the entries of Airflow's
``/api/v2/monitor/health``, whose reasons are fixed codes and fixed words only (nothing a task, a module,
a path or an exception said, whatever the status file holds); and :func:`status`, everything the
``status`` command shows, for an authenticated user, with what was wrong in a file it read. Both judge
each file the same way (:func:`judge`): a file is only as good as what the reader can tell about its
writer, so a file from another host, or from a scheduler that stopped, is never taken for a running,
healthy executor. Nothing here knows Airflow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from async_local_executor.core.health import PUBLIC_REASONS, WITHHELD
from async_local_executor.ops.status_read import Found, adoption_of

HEALTHY, UNHEALTHY, UNKNOWN = "healthy", "unhealthy", "unknown"

# The public reasons this reader gives of its own, beside those of a verdict (core.health.PUBLIC_REASONS).
JUDGED = {
    "other_host": "written on another host: this api-server cannot tell whether that scheduler still runs",
    "scheduler_gone": "its scheduler is not running",
    "status_stale": "its scheduler runs, but its executor stopped updating its status",
    "unknown_verdict": "its status file gives no verdict this version knows",
}
_WORDS = {**PUBLIC_REASONS, **JUDGED}

_TRY = re.compile(r"^(?P<task>.*) try (?P<try>\d+)$")


@dataclass(frozen=True)
class Judged:
    """One status file's verdict as this reader gives it.

    :param reasons: why, in full (task names, pids), for an authenticated reader
    :param codes: why, as fixed codes (each a key of ``JUDGED`` or of ``core.health.PUBLIC_REASONS``)
    """

    found: Found
    verdict: str
    reasons: tuple[str, ...]
    codes: tuple[str, ...]

    @property
    def public(self) -> tuple[str, ...]:
        """The fixed words of each code."""
        return tuple(_WORDS[code] for code in self.codes)


def judge(found: Found, hostname: str) -> Judged:
    """The verdict on one status file, read on ``hostname``."""
    data = found.data
    written_on = _written_on(found)
    if written_on != hostname:
        # The pid and the journal lock the file was checked with are this host's, not its writer's.
        why = (
            f"written on host {written_on}, and this api-server runs on {hostname}: it cannot tell whether "
            "that scheduler still runs (run the api-server on the scheduler's host, or ask that host)"
        )
        return Judged(found, UNKNOWN, (why,), ("other_host",))
    if found.gone:
        return Judged(found, UNKNOWN, (f"{found.stale}: stopped or killed",), ("scheduler_gone",))
    if found.stale is not None:
        # Its scheduler runs, but its executor stopped reporting: a wedged loop or a dead writer.
        return Judged(
            found, UNHEALTHY, (f"its scheduler runs, but its status was {found.stale}",), ("status_stale",)
        )
    health = data.get("health")
    verdict = health.get("status") if isinstance(health, dict) else None
    if not isinstance(health, dict) or verdict not in (HEALTHY, UNHEALTHY, UNKNOWN):
        why = "no health verdict" if verdict is None else f"unknown verdict {verdict!r}"
        return Judged(found, UNKNOWN, (why,), ("unknown_verdict",))
    reasons = _strings(health.get("reasons"))
    # Only codes this version knows, told in its own words: what the file says in words (a reason may
    # name a module or a path) never goes public, and reasons without a code are withheld.
    codes = tuple(
        dict.fromkeys(c if c in PUBLIC_REASONS else WITHHELD for c in _strings(health.get("public_codes")))
    )
    if reasons and not codes:
        codes = (WITHHELD,)
    return Judged(found, verdict, reasons, codes)


def overall(judged: Sequence[Judged]) -> str:
    """Unhealthy when any executor is, healthy when one is and none is unhealthy, else unknown."""
    verdicts = {j.verdict for j in judged}
    if UNHEALTHY in verdicts:
        return UNHEALTHY
    return HEALTHY if HEALTHY in verdicts else UNKNOWN


def no_status_reason(hostname: str) -> str:
    return (
        f"no executor status on host {hostname}: no scheduler with AsyncLocalExecutor has run here since it "
        "last shut down (the status is read from the state directory of the api-server's own host)"
    )


def health(found: Sequence[Found], hostname: str, now: float) -> dict[str, Any]:
    """The public health document: the overall status and one entry per executor, its reasons in fixed
    codes (``reason_codes``) and fixed words (``reasons``), nothing a task, a module or a path said."""
    judged = [judge(f, hostname) for f in found]
    document: dict[str, Any] = {
        "status": overall(judged),
        "instances": [
            {
                "hostname": _written_on(j.found),
                "instance": str(j.found.data.get("instance", j.found.path.name)),
                "verdict": j.verdict,
                "reasons": list(j.public),
                "reason_codes": list(j.codes),
                **_times(j.found, now),
                **_control(j.found),
            }
            for j in judged
        ],
    }
    if not judged:
        document["reason"] = no_status_reason(hostname)
    return document


# A drain that passed its deadline with work still running: a warning, not a verdict (the executor works).
OVERDUE = "a drain passed its deadline with workloads still running"


def _control(found: Found) -> dict[str, Any]:
    """Live control as the health document gives it: the mode, who set it and when (an operator's own
    action, not a task's words), and a drain past its deadline as a warning. Paused is not unhealthy."""
    fields = found.data.get("control")
    if not isinstance(fields, dict):
        return {}
    shown = {"control": str(fields.get("mode")), "control_note": fields.get("note")}
    return {**shown, "warnings": [OVERDUE] if fields.get("overdue") else []}


def status(found: Sequence[Found], hostname: str, now: float, directory: Path) -> dict[str, Any]:
    """Everything the ``status`` command shows, per executor, with the verdict :func:`judge` gives."""
    judged = [judge(f, hostname) for f in found]
    executors = []
    for j in judged:
        data = j.found.data
        running = [_with_task(row) for row in data.get("running", [])]
        parallelism = data.get("parallelism")
        live = data.get("control")
        if isinstance(live, dict) and _int(live.get("parallelism")):
            parallelism = live["parallelism"]  # the limit in force (a resize), not the configured one
        waiting = data.get("waiting", 0)
        prefetched = None
        if _int(parallelism) and _int(waiting):
            # Accepted beyond the free slots: waiting inside the executor for a slot to free.
            prefetched = max(0, len(running) + waiting - parallelism)
        executors.append(
            {
                **data,
                "hostname": _written_on(j.found),
                "running": running,
                "recent_finished": [_with_task(row) for row in data.get("recent_finished", [])],
                "verdict": j.verdict,
                "reasons": list(j.reasons),
                "reason_codes": list(j.codes),
                "problems": list(j.found.problems),
                "stale": j.found.stale,
                "gone": j.found.gone,
                "prefetched": prefetched,
                **_times(j.found, now),
            }
        )
    document: dict[str, Any] = {
        "status": overall(judged),
        "hostname": hostname,
        "state_dir": str(directory),
        "read_at": now,
        "executors": executors,
    }
    if not judged:
        document["reason"] = no_status_reason(hostname)
    return document


def _with_task(row: dict[str, Any]) -> dict[str, Any]:
    """A workload's row with its task and try apart (its label, ``key``, says ``<task> try <n>``), and, for
    a running one a predecessor handed over, its ``adoption``."""
    label = str(row.get("key", ""))
    match = _TRY.match(label)
    task, attempt = (match["task"], int(match["try"])) if match else (label, None)
    shown = {**row, "task": task, "try": attempt}
    adoption = adoption_of(row)
    if adoption is not None or "adoption" in row:  # one this version does not know is not passed on
        shown["adoption"] = adoption
    return shown


def _written_on(found: Found) -> str:
    return str(found.data["hostname"])  # read_all only returns files that name their host


def _times(found: Found, now: float) -> dict[str, Any]:
    written = float(found.data["written_at"])  # read_all only returns files with a finite one
    try:
        updated = datetime.fromtimestamp(written, timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):
        updated = None
    return {"updated_at": updated, "age_s": round(now - written, 1)}


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
