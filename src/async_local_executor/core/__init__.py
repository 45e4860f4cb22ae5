"""The supervision core: launches, watches and stops child processes. It knows nothing of Airflow.

Admission (``supervisor``, ``admission``), how a workload is stopped (``stopping``), what an exit means
(``outcome``), the phase table (``lifecycle``), the event loop on its thread (``runtime``), the loop's
health (``health``), how many to take ahead (``prefetch``), ties between processes (``lifeline``,
``cpu_priority``) and the ways to start a child, containment and the crowd's CPU share among them
(``launchers/``). Every module here imports without Airflow; ``tests/packaging/test_layers.py`` checks
each in a fresh interpreter and reads each for deferred imports.
"""
