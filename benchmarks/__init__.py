"""Benchmark suite: AsyncLocalExecutor against the stock LocalExecutor on a real Airflow.

``python -m benchmarks --help`` runs it; ``docs/benchmarks.md`` explains every figure.
"""
