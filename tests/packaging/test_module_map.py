"""docs/design.md's module map is the tree: every module listed, nothing listed that is gone."""

from __future__ import annotations

from tests.packaging.module_map import DESIGN, TREES, current, module_map, rows


def test_the_module_map_in_the_design_doc_matches_the_tree() -> None:
    assert current(DESIGN.read_text()) == module_map(), "run `make docs` to regenerate docs/design.md's map"


def test_every_module_says_what_it_owns() -> None:
    missing = [f"{prefix}/{name}" for _, package, prefix in TREES for name, text in rows(package) if not text]
    assert missing == []
