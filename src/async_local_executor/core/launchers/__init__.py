"""Launch paths: each turns a :class:`~.base.LaunchRequest` into a running :class:`~.base.Child`.

``base.py`` is the contract; ``subprocess.py`` starts a fresh interpreter per workload;
``forkserver.py`` and ``forkserver_helper.py`` are the two sides of the fork-server path. Nothing is
imported here, so ``python -m async_local_executor.core.launchers.forkserver_helper`` starts clean.
"""
