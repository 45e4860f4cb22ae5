"""The modules a Python file imports at its top level, read without running it.

The same idea as Airflow's ``iter_airflow_imports`` (which the dag-processor uses to pre-import the
``airflow`` modules a DAG file names), for every module: the statements at module level, including
those inside ``if``/``try``/``with`` blocks there, but not inside functions or classes, whose imports
run only when they are called (the task processes' own observation covers those).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

# A DAG file larger than this is not read (nothing real is; a generated file may be).
MAX_SOURCE = 4 * 1024 * 1024


def top_level_imports(path: str) -> list[str]:
    """Absolute module names the file at ``path`` imports at module level, in order, without repeats.

    ``from pkg import name`` gives ``pkg`` and ``pkg.name`` (which may be a submodule; the fork server
    finds out when it tries). Relative imports and unreadable or invalid files give nothing.
    """
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_SOURCE + 1)
        if len(source) > MAX_SOURCE:
            return []
        tree = ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):  # no file to learn from
        return []
    return list(dict.fromkeys(_names(tree.body)))


def _names(body: list[ast.stmt]) -> Iterator[str]:
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                continue
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _names(node.orelse)  # what only a type checker reads never runs
        else:
            for field in ("body", "orelse", "finalbody"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    yield from _names([c for c in children if isinstance(c, ast.stmt)])
            for handler in getattr(node, "handlers", None) or ():
                # `except ImportError:` holds a fallback, which runs only where the `try` failed (and
                # what a task process then imports is learned from the process itself).
                if not _catches_import_error(handler):
                    yield from _names(handler.body)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError") for k in kinds)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
