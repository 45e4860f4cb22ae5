"""The fork server's helper process: everything that runs in it, and nothing that runs in the scheduler.

``__main__`` is its start (``python -m async_local_executor.core.launchers.forkserver.helper``);
``server`` answers the loop's requests and forks each workload with ``clone``; ``preload`` imports the
learned modules one by one, refusing what ``threads`` (it must stay single-threaded to fork; the native
thread pools that can be stopped are stopped) or ``hygiene`` (what a child must not inherit) forbids.
Every module here imports only the standard library, and this one nothing at all.
"""
