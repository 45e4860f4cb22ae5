"""The Airflow adapter: the executor class Airflow loads, its configuration and provider info, and
what runs inside each workload process (``child`` on Airflow 3, ``child_cli`` on Airflow 2)."""
