"""How a running workload is stopped: the policy's signal, a grace period, then SIGKILL.

The stop ends when the process exits, never when a signal has merely been sent: the supervisor reports
a terminated workload only once its process is gone.
"""

from __future__ import annotations

import logging
import signal

import anyio

from async_local_executor.core.clock import Clock
from async_local_executor.core.launchers.base import Child
from async_local_executor.core.termination import TerminationPolicy

log = logging.getLogger(__name__)


async def escalate(
    child: Child, exited: anyio.Event, policy: TerminationPolicy, clock: Clock, label: object
) -> None:
    """Signal ``child``'s group, and SIGKILL it if ``exited`` is not set within the grace period.

    :param label: names the workload in the log
    """
    child.signal(policy.signal)
    async with anyio.create_task_group() as tg:

        async def kill_after_grace() -> None:
            await clock.sleep(policy.grace)
            log.warning(
                "workload %s (pid %d) still running %.1fs after %s; sending SIGKILL",
                label,
                child.pid,
                policy.grace,
                policy.signal.name,
            )
            child.signal(signal.SIGKILL)

        tg.start_soon(kill_after_grace)
        await exited.wait()
        tg.cancel_scope.cancel()
