"""docs/design.md's generated parts are the code: every module mapped, nothing gone, the diagram the table."""

from __future__ import annotations

from async_local_executor.core.lifecycle import TRANSITIONS
from tests.packaging.design_doc import DESIGN, DIAGRAM, MAP, current, module_map, phase_diagram, sections


def test_the_module_map_in_the_design_doc_matches_the_tree() -> None:
    assert current(DESIGN.read_text(), MAP) == module_map(), "run `make docs` to regenerate docs/design.md"


def test_the_phase_diagram_in_the_design_doc_is_the_transition_table() -> None:
    assert current(DESIGN.read_text(), DIAGRAM) == phase_diagram(), (
        "run `make docs` to regenerate docs/design.md"
    )
    # Every edge of the table, and nothing else, is drawn.
    edges = [
        line
        for line in phase_diagram().splitlines()
        if line.startswith("  ") and "-->" in line and "[*]" not in line
    ]
    assert len(edges) == len(TRANSITIONS)


def test_every_module_says_what_it_owns() -> None:
    missing = [f"{title}: {name}" for title, table in sections() for name, text in table if not text]
    assert missing == []
