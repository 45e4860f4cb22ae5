"""Learning what workloads import, so the fork server can import it once for all of them.

``observe`` runs in each workload process and records the modules it loads; ``source`` reads the
top-level imports of a Python file without running it; ``learned`` is the launcher's memory of what was
learned, preloaded and refused; ``loop`` decides when a helper that preloads a grown set is worth
starting. The helper's side (importing the learned modules one by one and refusing what is unsafe) is
:mod:`async_local_executor.core.launchers.forkserver.helper.preload`. Nothing is imported here:
``observe`` runs in processes that must start fast.
"""
