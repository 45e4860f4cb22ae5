"""A throwaway site for the fork server's learning (plain child processes): a fake installed distribution
and DAG files that import from it, and a fork server that learns from them.

The "site" directory holds modules of a fake installed distribution (one good, one that starts a thread at
import, one that raises, and others that harm what every task would observe) and a "dags" directory holds
a module of no distribution, both on the helpers' PYTHONPATH only. Workloads name a "DAG file" importing
them at its top. tests/core/launchers/forkserver/conftest.py makes one per test (``world``).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import anyio

from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.forkserver.learning.learned import Learned
from async_local_executor.core.launchers.forkserver.learning.loop import Learning
from tests.core.helpers import GUARD, Recorder
from tests.core.supervising import TARGET

DIST = "fakepre-good"


def distribution(site: Path, version: str) -> None:
    package = site / "fakepre_good"
    package.mkdir(exist_ok=True)
    # pip's upgrade removes the old version's files, its bytecode with them: a cached .pyc of a source
    # of the same size and second would otherwise still be imported as the old version.
    shutil.rmtree(package / "__pycache__", ignore_errors=True)
    init = package / "__init__.py"
    init.write_text(f"import fakepre_dep\nVERSION = {version!r}\n")
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
        "fakepre_good\nfakepre_dep\nfakepre_thread\nfakepre_broken\nfakepre_late\nfakepre_rng\nfakepre_seeds\n"
        "fakepre_env\nfakepre_log\nfakepre_patch\nfakepre_warns\n"
    )
    (info / "RECORD").write_text("")


def world(tmp_path: Path) -> dict[str, Path]:
    """Make the site, the DAGs folder and the learning directory under ``tmp_path``."""
    site, dags, learn = tmp_path / "site", tmp_path / "dags", tmp_path / "learn"
    for d in (site, dags, learn):
        d.mkdir()
    distribution(site, "1.0")
    (site / "fakepre_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True, name='phone-home').start()\n"
    )
    (site / "fakepre_dep.py").write_text("DEPENDENCY = True\n")  # what fakepre_good imports
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
