"""The supervision core: launches, watches and stops child processes. It knows nothing of Airflow.

Admission and escalation (``supervisor``, ``admission``, ``escalation``), what an exit means
(``outcome``), the phase table (``lifecycle``), the event loop on its thread (``runtime``), the loop's
health (``health``), how many to take ahead (``prefetch``), ties between processes (``lifeline``,
``cpu_priority``) and the two ways to start a child (``launchers/``). Every module here imports
without Airflow; ``tests/core/test_contracts.py`` checks each in a fresh interpreter.
"""
