"""The Airflow adapter: the executor class Airflow loads, its configuration and provider info, and
what runs inside each workload process (:mod:`~async_local_executor.adapter.workload`)."""
