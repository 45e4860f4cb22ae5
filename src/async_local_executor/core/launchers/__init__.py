"""Launch paths: each turns a :class:`~.base.LaunchRequest` into a running :class:`~.base.Child`.

``base.py`` is the contract and ``output.py`` reads a child's output for every path; ``tree.py``
signals a child's whole process tree. ``subprocess.py`` starts a fresh interpreter per workload.
``contained.py`` (a cgroup per workload) and ``crowd.py`` (a crowded start's CPU share) wrap either path.
``forkserver/`` forks each workload from a helper that imported everything once: the loop's side
(``launcher``, ``process``, ``channel``, ``child``), the helper's side (the ``helper`` package, run as
``python -m async_local_executor.core.launchers.forkserver.helper``), the typed ``protocol`` between
them, and the ``learning`` of what workloads import. Nothing is imported here, so that helper and the
workloads that record their imports start clean.
"""
