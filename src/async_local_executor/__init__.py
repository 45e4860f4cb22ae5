"""An Airflow executor for one host: an event loop supervises one process per workload.

``[core] executor = async_local_executor.AsyncLocalExecutor``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from async_local_executor.adapter.executor import AsyncLocalExecutor

__all__ = ["AsyncLocalExecutor", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so the supervision core can be imported (and tested) without importing Airflow.
    if name == "AsyncLocalExecutor":
        from async_local_executor.adapter.executor import AsyncLocalExecutor

        return AsyncLocalExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
