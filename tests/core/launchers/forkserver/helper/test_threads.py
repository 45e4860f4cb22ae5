"""The helper stays single-threaded to fork (``helper/threads.py``): NumPy's OpenBLAS worker threads, which
start at its import, are stopped before the helper counts its threads, and restart in each task."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from tests.core.helpers import GUARD, Recorder, py
from tests.core.launchers.forkserver.fake_site import learning_server, preloaded, refused, until
from tests.core.supervising import serving

pytestmark = pytest.mark.one_loop


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
