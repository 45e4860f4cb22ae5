"""The fork server: a helper process that has imported everything once forks one child per workload.

Two sides and the protocol between them. The loop's side, in the scheduler: ``launcher`` (when a helper
starts, is replaced, stops while idle, or a launch falls back), ``process`` (one helper: its start,
handshake, requests and watchdog), ``channel`` (the loop's end of its socket) and ``child`` (a forked
workload, reaped through a pidfd). The helper's side is the ``helper`` package, run as
``python -m async_local_executor.core.launchers.forkserver.helper``. ``protocol`` holds every message
between them. ``learning`` learns what workloads import, so a helper can preload it.

Nothing is imported here: the helper, and ``learning.observe`` in each workload, must start fast.
"""

# Every module of the loop's side logs under the launcher's name: one logger for the fork server.
LOGGER = "async_local_executor.core.launchers.forkserver"
