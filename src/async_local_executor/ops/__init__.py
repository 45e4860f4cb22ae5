"""Operations: the launch journal that survives a crashed scheduler, the status file a running executor
writes, and the ``async-local-executor`` command that reads both."""
