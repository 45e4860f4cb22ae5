"""Old path of :mod:`async_local_executor.core.launchers`, kept for a scheduler started before an
upgrade: it starts its next fork server as ``python -m async_local_executor.launchers.forkserver_helper``.
Nothing is imported here, so that helper starts clean."""
