"""What a forked task must not inherit from the helper's preloads (``helper/hygiene.py``): a random
generator's state, the environment, a patched function, open descriptors, warnings filters. Learned
modules are preloaded by a real fork server from tests/core/launchers/forkserver/fake_site.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.learning import loop
from tests.core.helpers import Recorder, py
from tests.core.launchers.forkserver.fake_site import learning_server, preloaded, refused, until
from tests.core.supervising import serving

pytestmark = pytest.mark.one_loop


@pytest.mark.asyncio
async def test_tasks_forked_after_numpy_random_was_preloaded_draw_numbers_of_their_own(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # NumPy seeds its global generator from the OS when numpy.random is imported (pandas imports it):
    # preloaded, that one state would be every task's. Generators a library makes are refused.
    monkeypatch.setattr(loop, "RETRY_AFTER_REFUSAL", 0.1)
    (world["dags"] / "random_dag.py").write_text(
        "import numpy.random\nimport fakepre_rng\nimport fakepre_seeds\n"
    )
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    draw = (
        "import random, sys, numpy.random; "
        "print('draw', 'numpy.random' in sys.modules, numpy.random.randint(2**62), random.getrandbits(62))"
    )
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("cold", py("pass"), source=str(world["dags"] / "random_dag.py")))
        await until(learning, lambda: {"fakepre_rng", "fakepre_seeds"} <= set(refused(learning)))
        await until(learning, lambda: "numpy.random" in preloaded(learning))
        for i in range(4):
            supervisor.submit(LaunchRequest(i, py(draw)))
        await recorder.until(lambda: len(recorder.outcomes) == 5)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    draws = [line.split()[1:] for k, line in recorder.lines if line.startswith("draw")]
    assert len(draws) == 4
    assert {d[0] for d in draws} == {"True"}  # forked after the preload
    assert len({d[1] for d in draws}) == 4  # NumPy's global generator: reseeded in each
    assert len({d[2] for d in draws}) == 4  # Python's own reseeds itself at fork
    reasons = refused(learning)
    assert (
        reasons["fakepre_rng"]
        == "importing it seeds a random generator every task would share: random.Random"
    )
    assert "numpy.random's global generator" in reasons["fakepre_seeds"]


@pytest.mark.asyncio
async def test_a_module_that_changes_the_whole_process_is_refused_and_warnings_filters_stay_as_they_were(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "RETRY_AFTER_REFUSAL", 0.1)
    names = ("fakepre_env", "fakepre_log", "fakepre_patch", "fakepre_warns")
    (world["dags"] / "side_effects_dag.py").write_text("".join(f"import {n}\n" for n in names))
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    look = (
        "import os, sys, warnings; "
        "print('seen', 'fakepre_warns' in sys.modules, any(getattr(f[1], 'pattern', '') == 'fakepre' "
        "for f in warnings.filters), os.environ.get('FAKEPRE_MODE'))"
    )
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(
            LaunchRequest("cold", py("pass"), source=str(world["dags"] / "side_effects_dag.py"))
        )
        await until(learning, lambda: set(names[:3]) <= set(refused(learning)))
        await until(learning, lambda: "fakepre_warns" in preloaded(learning))
        supervisor.submit(LaunchRequest("warm", py(look)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    # Preloaded, but its filter is gone: Airflow drops what a DAG file's imports add (catch_warnings).
    assert next(line for _, line in recorder.lines if line.startswith("seen")) == "seen True False None"
    reasons = refused(learning)
    assert reasons["fakepre_env"] == (
        "importing it changes what every task would observe: the environment (FAKEPRE_MODE)"
    )
    assert reasons["fakepre_patch"] == (
        "importing it changes what every task would observe: time.sleep (replaced)"
    )
    assert reasons["fakepre_log"].startswith(
        "importing it leaves descriptors open that a task's own files would reuse: "
    )
    assert "(/dev/null)" in reasons["fakepre_log"]


def test_a_reseed_that_fails_costs_the_task_nothing_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    from async_local_executor.core.launchers.forkserver.helper import hygiene

    def broken() -> None:
        raise OSError("no entropy")

    monkeypatch.setitem(sys.modules, "numpy.random", types.SimpleNamespace(seed=broken))
    hygiene.reseed_inherited()  # does not raise: the workload runs
    assert (
        "could not reseed numpy.random's global generator: OSError('no entropy')" in capsys.readouterr().err
    )
