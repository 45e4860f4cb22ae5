"""``async_local_executor.executor.AsyncLocalExecutor``: the class path Airflow 2 configurations name.

The class lives in :mod:`async_local_executor.adapter.executor`.
"""

from async_local_executor.adapter.executor import AsyncLocalExecutor

__all__ = ["AsyncLocalExecutor"]
