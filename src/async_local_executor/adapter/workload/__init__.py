"""What runs inside each workload process, never in the scheduler: ``python -m`` (or the fork server's
target) :mod:`~.airflow3` on Airflow 3, :mod:`~.airflow2` on Airflow 2, both built on :mod:`~.entry`.

Rule: these modules import what a task process needs and nothing of the executor, so a workload
process (and the fork server that preloads them) starts as light as it can.
"""
