"""Launch paths: each turns a :class:`~.base.LaunchRequest` into a running :class:`~.base.Child`.

``base.py`` is the contract and ``output.py`` reads a child's output for every path; ``subprocess.py``
starts a fresh interpreter per workload. ``contained.py`` (a cgroup per workload) and ``crowd.py`` (a
crowded start's CPU share) wrap either path. The fork-server path: ``forkserver.py`` (when helpers start,
are replaced, stop while idle, or a launch falls back), ``forkserver_process.py`` (one helper: handshake,
requests, watchdog), ``forkserver_channel.py`` (the loop's end of its socket), ``forkserver_child.py``
(a forked workload, reaped through a pidfd); ``forkserver_protocol.py`` is shared by both sides; the
helper's side is ``forkserver_helper.py`` and ``forkserver_clone.py``. Nothing is imported here, so
``python -m async_local_executor.core.launchers.forkserver_helper`` starts clean.
"""
