"""What ``async-local-executor status`` says about preloading (``cli.preload_lines``), from a status
file's ``preload`` entry."""

from __future__ import annotations

from async_local_executor.ops.cli import preload_lines


def test_learned_preloads_and_refusals_are_listed_with_their_reasons() -> None:
    lines = [
        str(t)
        for t in preload_lines(
            {
                "mode": "auto",
                "preloaded": [
                    {"module": "pandas", "distribution": "pandas", "version": "3.1.1", "kib": 59392},
                    {"module": "numpy", "distribution": "numpy", "version": "2.4.6", "kib": 0},
                ],
                "refused": [{"module": "dag_helpers", "reason": "not a module of an installed distribution"}],
                "pending": ["termcolor"],
                "generation": 2,
            }
        )
    ]
    assert lines == [
        "  preload (auto): 2 learned modules preloaded: pandas (pandas 3.1.1) 58 MiB, numpy (numpy 2.4.6)",
        "    refused dag_helpers: not a module of an installed distribution",
        "    to try next: termcolor",
    ]


def test_explicit_preloads_and_older_files_without_the_entry() -> None:
    assert [str(t) for t in preload_lines({"mode": "explicit", "modules": ["pandas"]})] == [
        "  preload (explicit): pandas"
    ]
    assert preload_lines(None) == []
    assert preload_lines("garbage") == []
