"""Targets for fork-server children in tests: no Airflow, just Python.

``python_c`` runs a ``[python, "-c", code, *args]`` request inside the forked child, so the same
``python -c`` scripts drive both launch paths.
"""

from __future__ import annotations

import io
import sys

PRELOADED = False
REEXPORT_PRELOADED = False  # set by tests.core.launchers.forkserver.reexport's preload


def preload() -> None:
    global PRELOADED
    PRELOADED = True


def python_c(argv: list[str], stdin: bytes) -> int:
    if len(argv) < 3 or argv[1] != "-c":
        raise ValueError(f"python_c runs only [python, -c, code] requests, got {argv!r}")
    sys.argv = ["-c", *argv[3:]]
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - test code only
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
