"""The top-level imports of a DAG file, read without running it (``learning/source.py``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from async_local_executor.core.launchers.forkserver.learning.source import top_level_imports


def test_top_level_imports_are_read_without_running_the_file(tmp_path: Path) -> None:
    dag = tmp_path / "dag.py"
    dag.write_text(
        textwrap.dedent(
            """
            import os, pandas as pd
            from airflow.sdk import dag, task
            from . import sibling
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import only_for_types
            try:
                import fast_json
            except ImportError:
                import json
            with open(__file__):
                import inside_with
            def f():
                import inside_function
            class C:
                import inside_class
            raise SystemExit("never run")
            """
        )
    )
    assert top_level_imports(str(dag)) == [
        "os",
        "pandas",
        "airflow.sdk",
        "airflow.sdk.dag",
        "airflow.sdk.task",
        "typing",
        "typing.TYPE_CHECKING",
        "fast_json",
        "inside_with",
    ]
    (tmp_path / "bad.py").write_text("import (")
    assert top_level_imports(str(tmp_path / "bad.py")) == []
    assert top_level_imports(str(tmp_path / "missing.py")) == []
