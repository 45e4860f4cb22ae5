"""The launcher's memory of what was learned (``learning/learned.py``): its file, and when a refusal is
tried again."""

from __future__ import annotations

import json
from pathlib import Path

from async_local_executor.core.launchers.forkserver.learning.learned import RETRY_FIRST, Learned
from async_local_executor.core.launchers.forkserver.protocol import Loaded, PreloadReport


def test_the_learned_set_is_written_through_a_temporary_name_of_its_own(tmp_path: Path) -> None:
    # Another writer's file at the old fixed name is neither truncated nor taken as ours.
    (tmp_path / "preloaded.json.tmp").write_text('["theirs"]')
    learned = Learned(str(tmp_path))
    learned.took(PreloadReport(loaded=(Loaded("json5", "json5", "1", 1, None),)), ["json5"])
    assert json.loads((tmp_path / "preloaded.json").read_text()) == ["json5"]
    assert (tmp_path / "preloaded.json.tmp").read_text() == '["theirs"]'
    assert (tmp_path / "preloaded.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preloaded.json", "preloaded.json.tmp"]


def test_a_refusal_that_may_pass_is_tried_again_later_and_one_that_cannot_never_is(tmp_path: Path) -> None:
    learned = Learned(str(tmp_path))
    learned.refuse(
        "flaky", "importing it starts a thread: preloading flaky started 1 thread (native python3)", 100.0
    )
    learned.refuse(
        "mine", "not a module of an installed distribution (the DAGs folder, a bundle, or none)", 100.0
    )
    assert not learned.retry_due(100.0 + RETRY_FIRST - 1)
    assert learned.retry_due(100.0 + RETRY_FIRST)
    assert list(learned.pending) == ["flaky"]
    assert set(learned.refused) == {"mine"}
    # Refused again: the wait doubles.
    learned.refuse("flaky", "fork server crashed while importing flaky", 1000.0)
    assert not learned.retry_due(1000.0 + 2 * RETRY_FIRST - 1)
    assert learned.retry_due(1000.0 + 2 * RETRY_FIRST)
    assert not learned.retry_due(10**9)  # nothing else is ever tried again
    assert set(learned.refused) == {"mine"}
