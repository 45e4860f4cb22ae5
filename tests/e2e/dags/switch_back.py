"""Tasks caught running when a deployment switches from this executor back to the stock LocalExecutor.

Each execution of ``work`` (map index ``i``) leaves marks in ``$ALE_HANDOVER_DIR``:

- ``work<i>.try<N>.pid<P>.start`` as it begins: JSON ``{"at": <wall time>, "instance": <the
  ASYNC_LOCAL_EXECUTOR_INSTANCE mark of its environment, or null>, "overlap": <bool>}``;
- ``work<i>.try<N>.pid<P>.end`` as it leaves, however it leaves but SIGKILL: ``{"at": ..., "how":
  "gate"`` (the test opened the gate) ``| "<exception class>"}``.

``overlap`` is exact, not a comparison of clocks: each execution first takes an exclusive ``flock`` on
``work<i>.lock`` and keeps it until its process exits, when the kernel drops it, however the process
ends. An execution that finds the lock taken runs while another execution of its task instance still
lives. It does not wait for the lock: it marks the overlap and goes on, as the hazard would.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from datetime import timedelta
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

TASKS = 3


def _write(path: Path, data: dict[str, object]) -> None:
    # Written aside and renamed: the test never reads a mark half written.
    aside = path.with_name(f".{path.name}")
    aside.write_text(json.dumps(data))
    aside.rename(path)


@dag(dag_id="switch_back", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def switch_back() -> None:
    # One retry, soon: a try that the switch terminates, fails or resets shows as a second try.
    @task(retries=1, retry_delay=timedelta(seconds=1))
    def work(i: int) -> int:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        mark = folder / f"work{i}.try{ti.try_number}.pid{os.getpid()}"
        # Never closed: the lock must last as long as this process, not as long as this function.
        lock = os.open(folder / f"work{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            overlap = False
        except BlockingIOError:
            overlap = True
        instance = os.environ.get("ASYNC_LOCAL_EXECUTOR_INSTANCE")
        _write(
            mark.with_name(f"{mark.name}.start"),
            {"at": time.time(), "instance": instance, "overlap": overlap},
        )
        how = "gate"
        try:
            while not (folder / "gate").exists():  # a file the test creates; no clock decides anything
                time.sleep(0.2)
        except BaseException as exc:  # SIGTERM arrives as an exception: note how this execution ended
            how = type(exc).__name__
            raise
        finally:
            _write(mark.with_name(f"{mark.name}.end"), {"at": time.time(), "how": how})
        return i

    work.expand(i=list(range(TASKS)))


switch_back()
