"""Launch paths: each turns a :class:`LaunchRequest` into a running :class:`Child`."""

from async_local_executor.launchers.base import Child, Launcher, LaunchRequest, OutputSink
from async_local_executor.launchers.subprocess import SubprocessLauncher

__all__ = ["Child", "LaunchRequest", "Launcher", "OutputSink", "SubprocessLauncher"]
