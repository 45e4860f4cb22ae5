"""The helper's start (``python -m async_local_executor.core.launchers.forkserver.helper``, run by
``helper/__main__.py``): it imports nothing heavy (tests/packaging/test_layers.py has the core's
independence from Airflow), and a preload that started a thread makes it say ``unfit`` in place of
``ready``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from async_local_executor.core.launchers.forkserver.protocol import MAX_MESSAGE, Unfit, decode
from tests.core.helpers import GUARD


def test_the_helper_names_the_preload_that_started_a_thread_and_does_not_serve() -> None:
    # In place of "ready": forking with a second thread running could copy a held lock into every
    # workload. Only the module that started it is blamed, not the preloads around it.
    loop_end, helper_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    preloads = ["decimal", "tests.core.launchers.forkserver.threaded", "fractions"]
    argv = [sys.executable, "-m", "async_local_executor.core.launchers.forkserver.helper"]
    argv += ["--fd", str(helper_end.fileno()), "--parent-pid", str(os.getpid())]
    argv += ["--target", "tests.core.launchers.forkserver.targets:python_c"]
    for module in preloads:
        argv += ["--preload", module]
    helper = subprocess.Popen(argv, pass_fds=[helper_end.fileno()])
    helper_end.close()
    try:
        loop_end.settimeout(GUARD)
        message = decode(loop_end.recv(MAX_MESSAGE))
    finally:
        loop_end.close()  # a helper that went on serving exits on this EOF
        returncode = helper.wait(GUARD)
    assert returncode == 1
    assert isinstance(message, Unfit)
    error = message.error
    assert error.startswith(
        "preloading tests.core.launchers.forkserver.threaded started 1 thread (sdk-exporter); "
    )
    assert "decimal" not in error
    assert "fractions" not in error


def test_helper_module_imports_nothing_heavy() -> None:
    code = "import sys, async_local_executor.core.launchers.forkserver.helper.__main__; print('anyio' in sys.modules, 'airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
