"""The development harness: a real, throwaway Airflow (api-server, scheduler, dag-processor, metadata
database) for the tests, the benchmarks and ``make demo``. Not part of the published package."""
