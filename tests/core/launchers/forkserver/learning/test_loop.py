"""The fork server's learning loop (``learning/loop.py``): what workloads import is learned, helpers that
preload what is safe of it are started, each refusal is kept by name, and its scans run on its clock.

The learned modules are those of tests/core/launchers/forkserver/fake_site.py. What is preloaded and
refused happens in the helper and its children, whatever loop the launcher runs on; the launcher's own
part (recording what was learned, retrying a refusal) is anyio code, the same on both loops, whose
loop-facing parts tests/core/launchers/forkserver/test_launcher.py runs on both. So the tests that run a
fork server run on uvloop alone (``one_loop``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.learning import loop
from async_local_executor.core.launchers.forkserver.learning.learned import Learned, Scan
from async_local_executor.core.launchers.forkserver.learning.loop import Learning
from async_local_executor.core.launchers.forkserver.protocol import Checked
from tests.core.helpers import GUARD, FakeClock, Recorder, py
from tests.core.launchers.forkserver.fake_site import (
    DIST,
    PROBE,
    distribution,
    had,
    learning_server,
    preloaded,
    refused,
    until,
)
from tests.core.supervising import serving

# Far longer than any test may take: only the fake clock can get there.
HOUR = 3600.0


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_what_a_dag_file_imports_is_preloaded_and_unsafe_modules_are_refused_by_name(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "RETRY_AFTER_REFUSAL", 0.1)
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        # The DAG file is read and what it names preloaded; the thread-starter comes from the
        # workload's own process (imported inside the function, as the hook reports).
        observe_then_import = (
            f"from async_local_executor.core.launchers.forkserver.learning import observe; observe.install({str(world['learn'])!r}); "
            + PROBE
            + "; import fakepre_thread"
        )
        supervisor.submit(LaunchRequest("first", py(observe_then_import), source=str(world["dag"])))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        await until(
            learning, lambda: {"fakepre_thread", "fakepre_broken", "dagmod"} <= set(refused(learning))
        )
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        supervisor.submit(LaunchRequest("second", py(PROBE), source=str(world["dag"])))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    assert had(recorder, "first") == []
    assert had(recorder, "second") == ["fakepre_good"]
    reasons = refused(learning)
    assert "starts a thread" in reasons["fakepre_thread"]
    assert "phone-home" in reasons["fakepre_thread"]
    assert reasons["fakepre_broken"].startswith("import failed: RuntimeError: this library is broken")
    assert "not a module of an installed distribution" in reasons["dagmod"]
    row = next(p for p in learning.learned.as_dict()["preloaded"] if p["module"] == "fakepre_good")
    assert (row["distribution"], row["version"]) == (DIST, "1.0")
    # Kept for a restart: the next scheduler tries the preloaded set at once.
    assert Learned(str(world["learn"])).pending == {"fakepre_good": None}


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_names_the_serving_helper_has_already_or_no_helper_would_take_start_no_helper(
    world: dict[str, Path],
) -> None:
    # What a DAG file imports is mostly what every helper imported with its target (the task SDK),
    # and modules of the DAGs folder: asked first, the serving helper says so, and no helper starts.
    (world["dags"] / "sdk_only.py").write_text(
        "import tests.core.launchers.forkserver.targets\n"
        "from tests.core.launchers.forkserver.targets import python_c\n"
        "import dagmod\n"
    )
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    answered = anyio.Event()
    checked = learning.learned.checked

    def spy(answer: Checked, now: float) -> list[str]:
        refused = checked(answer, now)
        answered.set()
        return refused

    learning.learned.checked = spy  # type: ignore[method-assign]
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("sdk", py(PROBE), source=str(world["dags"] / "sdk_only.py")))
        with anyio.fail_after(GUARD):
            await answered.wait()
        assert learning.learned.pending == {}
        assert "not a module of an installed distribution" in refused(learning)["dagmod"]
        assert launcher.helpers_started == 1
        supervisor.submit(LaunchRequest("first", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        supervisor.submit(LaunchRequest("second", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 3)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    assert launcher.helpers_started == 2  # the first, and the one that preloads what was new
    assert had(recorder, "second") == ["fakepre_good"]
    assert learning.learned.generation == 1


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_a_module_a_preloaded_one_brought_in_is_preloaded_by_name_once_learned(
    world: dict[str, Path],
) -> None:
    # fakepre_good imports fakepre_dep: the helper that preloads the first has the second too, but
    # only as what a learned module brought in. Learned by name later, it is preloaded by name, so
    # that its file is watched for an upgrade like any preloaded module's.
    (world["dags"] / "dep_dag.py").write_text("import fakepre_dep\n")
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("first", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        supervisor.submit(LaunchRequest("dep", py(PROBE), source=str(world["dags"] / "dep_dag.py")))
        await until(learning, lambda: "fakepre_dep" in preloaded(learning))
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    [dep] = [p for p in learning.learned.preloaded.values() if p.module == "fakepre_dep"]
    assert dep.stamp is not None
    assert dep.file is not None
    assert dep.file.endswith("fakepre_dep.py")


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_a_restarted_launcher_preloads_what_its_predecessor_kept_with_one_more_helper(
    world: dict[str, Path],
) -> None:
    # A scheduler restart: the kept set names a library and what every helper has; the first helper
    # is asked about both, and one more helper preloads the library alone.
    kept = ["tests.core.launchers.forkserver.targets", "fakepre_good"]
    (world["learn"] / "preloaded.json").write_text(json.dumps(kept))
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        supervisor.submit(LaunchRequest("after", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    assert had(recorder, "after") == ["fakepre_good"]
    assert (launcher.helpers_started, learning.learned.generation) == (2, 1)
    assert preloaded(learning) == {"fakepre_good"}


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_an_upgraded_distribution_is_imported_anew_by_the_next_helper(world: dict[str, Path]) -> None:
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("v1", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        generation = learning.learned.generation
        supervisor.submit(LaunchRequest("preloaded", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        distribution(world["site"], "2.0")  # what `pip install -U` does to its files
        await until(learning, lambda: learning.learned.generation > generation)
        supervisor.submit(LaunchRequest("v2", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 3)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    assert had(recorder, "preloaded") == ["fakepre_good"]
    assert had(recorder, "v2") == ["fakepre_good"]
    versions = {k: line.split()[1] for k, line in recorder.lines if line.startswith("version")}
    assert versions["preloaded"] == "1.0"
    assert versions["v2"] == "2.0"
    row = next(p for p in learning.learned.as_dict()["preloaded"] if p["module"] == "fakepre_good")
    assert row["version"] == "2.0"


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_excluded_modules_are_never_tried(world: dict[str, Path]) -> None:
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world, exclude=("fakepre_good",))
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "dagmod" in refused(learning))
    assert "fakepre_good" not in preloaded(learning) | set(refused(learning))


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_a_thread_a_learned_module_starts_later_costs_the_preloads_not_the_fork_server(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = world["learn"].parent / "late-gate"
    monkeypatch.setenv("FAKEPRE_LATE_GATE", str(gate))
    (world["dags"] / "late_dag.py").write_text("import fakepre_late\n")
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("before", py(PROBE), source=str(world["dags"] / "late_dag.py")))
        await until(learning, lambda: "fakepre_late" in preloaded(learning))
        helper = launcher.report().pid
        assert helper is not None
        gate.touch()  # the module's thread starts when the helper next counts its threads: before a fork
        # The helper refuses this fork; the launch goes to a new helper that preloads none of it.
        supervisor.submit(LaunchRequest("after", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert launcher.problem is None
        assert launcher.report().pid not in (None, helper)
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    assert "a thread started in the fork server after it preloaded this" in refused(learning)["fakepre_late"]
    assert had(recorder, "after") == []


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_a_failure_while_learning_stops_the_learning_and_nothing_else(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)

    def broken() -> None:
        raise RuntimeError("a bug in the learning")

    monkeypatch.setattr(learning.learned, "scan", broken)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", py(PROBE), source=str(world["dag"])))
        with anyio.fail_after(GUARD):
            await learning.stopped.wait()
        supervisor.submit(LaunchRequest("after", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert all(o.ok for o in recorder.outcomes)
    assert "learning what tasks import stopped" in caplog.text
    assert "a bug in the learning" in caplog.text


@pytest.mark.asyncio
async def test_the_learning_scans_when_its_clock_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "SCAN_EVERY", HOUR)
    clock = FakeClock()
    learned = Learned(str(tmp_path))
    scans: list[float] = []
    scanned = threading.Event()  # the scan runs in a worker thread
    real_scan = learned.scan

    def scan() -> Scan:
        scans.append(clock.monotonic())
        scanned.set()
        return real_scan()

    monkeypatch.setattr(learned, "scan", scan)

    async def grow(modules: list[str]) -> bool:
        raise AssertionError("nothing was learned: no helper is wanted")

    async def have(modules: list[str]) -> Checked | None:
        raise AssertionError("nothing was learned: no helper is asked")

    learning = Learning(learned, interval=60.0, clock=clock)
    start = clock.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(learning.run, grow, have)
        await clock.sleepers(1)  # the scan period, parked on the fake clock
        clock.advance(HOUR - 1)
        await anyio.wait_all_tasks_blocked()
        assert scans == []
        clock.advance(1)
        assert await anyio.to_thread.run_sync(scanned.wait, GUARD)
        assert scans == [start + HOUR]
        tg.cancel_scope.cancel()
    assert not learning.stopped.is_set()
