"""Learning what workloads import, so the fork server can import it once for all of them.

``observe.py`` runs in each workload process and records the modules it loads; ``source.py`` reads the
top-level imports of a Python file without running it; ``learned.py`` is the launcher's memory of what
was learned, preloaded and refused. The helper's side (importing the learned modules one by one and
refusing what is unsafe) is :mod:`async_local_executor.core.launchers.forkserver_preload`. Nothing is
imported here: ``observe`` runs in processes that must start fast.
"""
