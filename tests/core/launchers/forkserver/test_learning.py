"""The fork server learns what workloads import and preloads what is safe of it (plain child processes).

A throwaway "site" directory holds modules of a fake installed distribution (one good, one that starts
a thread at import, one that raises) and a "dags" directory holds a module of no distribution, both on
the helpers' PYTHONPATH only. Workloads name a "DAG file" importing them all at its top.

What is preloaded and refused happens in the helper and its children, whatever loop the launcher runs
on; the launcher's own part (recording what was learned, retrying a refusal) is anyio code, the same on
both loops, whose loop-facing parts tests/core/launchers/forkserver/test_launcher.py runs on both. So
these tests run on uvloop alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.forkserver.learning import loop, observe
from async_local_executor.core.launchers.forkserver.learning.learned import RETRY_FIRST, Learned
from async_local_executor.core.launchers.forkserver.learning.loop import Learning
from async_local_executor.core.launchers.forkserver.learning.source import top_level_imports
from async_local_executor.core.launchers.forkserver.protocol import Loaded, PreloadReport
from tests.core.helpers import GUARD, Recorder, py
from tests.core.supervising import TARGET, serving

pytestmark = pytest.mark.one_loop

DIST = "fakepre-good"


def _distribution(site: Path, version: str) -> None:
    package = site / "fakepre_good"
    package.mkdir(exist_ok=True)
    init = package / "__init__.py"
    init.write_text(f"VERSION = {version!r}\n")
    st = init.stat()
    os.utime(init, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # an upgrade is a new file
    for old in site.glob("fakepre_good-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"fakepre_good-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(
        "fakepre_good\nfakepre_thread\nfakepre_broken\nfakepre_late\nfakepre_rng\nfakepre_seeds\n"
        "fakepre_env\nfakepre_log\nfakepre_patch\nfakepre_warns\n"
    )
    (info / "RECORD").write_text("")


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    site, dags, learn = tmp_path / "site", tmp_path / "dags", tmp_path / "learn"
    for d in (site, dags, learn):
        d.mkdir()
    _distribution(site, "1.0")
    (site / "fakepre_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True, name='phone-home').start()\n"
    )
    (site / "fakepre_broken.py").write_text("raise RuntimeError('this library is broken')\n")
    # As more_itertools.recipes does: a generator of its own, seeded from the OS at import.
    (site / "fakepre_rng.py").write_text("import random\n_randrange = random.Random().randrange\n")
    # Libraries that change the whole process when imported.
    (site / "fakepre_env.py").write_text("import os\nos.environ['FAKEPRE_MODE'] = 'on'\n")
    (site / "fakepre_log.py").write_text("import os\n_log = open(os.devnull, 'w')\n")
    (site / "fakepre_patch.py").write_text("import time\ntime.sleep = lambda seconds: None\n")
    (site / "fakepre_warns.py").write_text(
        "import warnings\nwarnings.filterwarnings('ignore', message='fakepre')\n"
    )
    # A library that seeds NumPy's global generator when imported.
    (site / "fakepre_seeds.py").write_text("import numpy.random\nnumpy.random.seed(7)\n")
    # Starts a thread later, once its gate file exists: at the helper's next look at its threads (an
    # audit hook on that listing, which changes nothing a task observes; a signal handler would, and
    # the module would be refused at import for it).
    (site / "fakepre_late.py").write_text(
        textwrap.dedent(
            """
            import os, sys, threading
            _stop = threading.Event()
            _gate = os.environ.get("FAKEPRE_LATE_GATE", "")

            def _hook(event, args):
                if event == "os.listdir" and _gate and os.path.exists(_gate) and not _stop.is_set():
                    _stop.set()
                    threading.Thread(target=threading.Event().wait, name="late-exporter", daemon=True).start()

            sys.addaudithook(_hook)
            """
        )
    )
    (dags / "dagmod.py").write_text("VALUE = 1\n")
    dag = dags / "my_dag.py"
    dag.write_text(
        textwrap.dedent(
            """
            import fakepre_good
            import dagmod
            try:
                import fakepre_broken
            except RuntimeError:
                pass

            def task():
                import fakepre_thread
            """
        )
    )
    return {"site": site, "dags": dags, "learn": learn, "dag": dag}


def learning_server(
    recorder: Recorder, world: dict[str, Path], **learned: object
) -> tuple[ForkServerLauncher, Learning]:
    learning = Learning(Learned(str(world["learn"]), **learned), interval=0.5)  # type: ignore[arg-type]
    path = os.pathsep.join([str(world["site"]), str(world["dags"]), *sys.path])
    launcher = ForkServerLauncher(
        target=TARGET, output=recorder.output, env={**os.environ, "PYTHONPATH": path}, learning=learning
    )
    return launcher, learning


async def until(learning: Learning, condition: Callable[[], bool]) -> None:
    with anyio.fail_after(GUARD):
        while not condition():
            await learning.updated()


def preloaded(learning: Learning) -> set[str]:
    return {p["module"] for p in learning.learned.as_dict()["preloaded"]}


def refused(learning: Learning) -> dict[str, str]:
    return {r["module"]: r["reason"] for r in learning.learned.as_dict()["refused"]}


# What a workload reports: which of the learned modules it found already imported when it started.
PROBE = (
    "import sys; mods = ('fakepre_good', 'fakepre_thread', 'fakepre_broken', 'dagmod'); "
    "print('had', *[m for m in mods if m in sys.modules]); "
    "import fakepre_good; print('version', fakepre_good.VERSION)"
)


def had(recorder: Recorder, key: object) -> list[str]:
    return next(line.split()[1:] for k, line in recorder.lines if k == key and line.startswith("had"))


@pytest.mark.asyncio
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
async def test_an_upgraded_distribution_is_imported_anew_by_the_next_helper(world: dict[str, Path]) -> None:
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("v1", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "fakepre_good" in preloaded(learning))
        generation = learning.learned.generation
        supervisor.submit(LaunchRequest("preloaded", py(PROBE)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        _distribution(world["site"], "2.0")  # what `pip install -U` does to its files
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
async def test_excluded_modules_are_never_tried(world: dict[str, Path]) -> None:
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world, exclude=("fakepre_good",))
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", py(PROBE), source=str(world["dag"])))
        await until(learning, lambda: "dagmod" in refused(learning))
    assert "fakepre_good" not in preloaded(learning) | set(refused(learning))


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


@pytest.mark.asyncio
async def test_numpy_is_preloaded_and_its_blas_threads_restart_in_each_task(world: dict[str, Path]) -> None:
    # NumPy's OpenBLAS starts worker threads at import: they are stopped before the helper forks.
    (world["dags"] / "numeric_dag.py").write_text("import numpy\n")
    recorder = Recorder()
    launcher, learning = learning_server(recorder, world)
    compute = (
        "import os, sys; had = 'numpy' in sys.modules; import numpy; a = numpy.ones((400, 400)); "
        "print('result', had, float((a @ a)[0, 0]), len(os.listdir('/proc/self/task')) >= 1)"
    )
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("cold", py(compute), source=str(world["dags"] / "numeric_dag.py")))
        await until(learning, lambda: "numpy" in preloaded(learning))
        helper = launcher.report().pid
        supervisor.submit(LaunchRequest("warm", py(compute)))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert helper is not None
        assert os.listdir(f"/proc/{helper}/task") == [str(helper)]  # single-threaded, fit to fork
    assert all(o.ok for o in recorder.outcomes), recorder.outcomes
    results = {k: line.split()[1:3] for k, line in recorder.lines if line.startswith("result")}
    assert results == {"cold": ["False", "400.0"], "warm": ["True", "400.0"]}
    assert "numpy" not in refused(learning)


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


@pytest.mark.asyncio
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


def test_pandas_and_numpy_get_the_same_verdict_on_every_start() -> None:
    # NumPy's OpenBLAS workers are stopped before the count; whether the kernel still listed one then
    # decided, on some starts, to refuse pandas. Five fresh helpers' worth of learning, one verdict.
    code = textwrap.dedent(
        """
        import json
        from async_local_executor.core.launchers.forkserver.helper.preload import Unfit, preload_learned
        from async_local_executor.core.launchers.forkserver.helper.threads import ThreadCensus
        try:
            report = preload_learned(["pandas", "numpy"], budget=0, census=ThreadCensus(), settle=1.0)
            print(json.dumps(sorted(row.module for row in report.loaded)))
        except Unfit as exc:
            print(json.dumps(["refused", exc.module, exc.reason]))
        """
    )
    verdicts = {
        subprocess.run(py(code), capture_output=True, text=True, check=True, timeout=GUARD).stdout.strip()
        for _ in range(5)
    }
    assert verdicts == {json.dumps(["numpy", "pandas"])}


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
