"""What a workload process records of the modules it and its forks load (``learning/observe.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

from async_local_executor.core.launchers.forkserver.learning import observe


def test_a_process_records_what_it_and_its_forks_load_that_its_parent_had_not(tmp_path: Path) -> None:
    code = (
        f"import os, sys, json; from async_local_executor.core.launchers.forkserver.learning import observe; observe.install({str(tmp_path)!r})\n"
        "import json, email.mime.text, xml.dom\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import csv; os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)
    names = observe.read(str(tmp_path))
    assert {"xml", "csv"} <= set(names)
    assert "json" not in names  # loaded before the hook
    assert "email.mime.text" in names  # as it was asked for
    assert not any(n.startswith("email.") and n != "email.mime.text" for n in names)  # what it brought in
    assert list(tmp_path.iterdir()) == []  # what was read is gone
