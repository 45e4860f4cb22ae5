"""The pages (README.md, docs/*.md) agree with the defaults about stops, systemd and installing.

- **KillMode.** With ``on_stop = handover``, the default, the running tasks outlive the scheduler's
  exit, and systemd's ``KillMode=mixed`` and ``KillMode=control-group`` SIGKILL them then. A page may
  recommend either only *together* with ``on_stop = terminate``: in the same block, a block being a
  paragraph, a list item (up to the next item, blank line or code fence), a table row or a fenced code
  block. Within a block, a clause (up to ``.``, ``;`` or ``:``) that names one of them is not a
  recommendation when it compares (``as systemd's KillMode=control-group does``, the generated text of
  ``kill_leftover_processes``) or warns: a negation before the name (``not``, ``never``, ``avoid``,
  ``instead of``, ``rather than``, ``without``), or ``would``, ``kills`` or ``SIGKILLs`` right after it.
- **Installing.** The package is on no package index: an install instruction never installs
  ``async-local-executor`` by name from an index (``--no-index`` with ``--find-links`` is a local
  directory, and allowed), and a requirement with extras is quoted, so that every shell (zsh too) passes
  the brackets to pip. A wheel a page installs is the one ``pip wheel`` builds from pyproject.toml, with
  extras pyproject.toml defines.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# `KillMode=mixed`, `KillMode = control-group`, "KillMode to mixed", "KillMode is mixed".
KILL_MODE = re.compile(r"KillMode`?\s*(?:=|\bto\b|\bis\b)\s*`?(mixed|control-group)\b")
TERMINATE = re.compile(r"on_stop`?\s*=\s*`?terminate\b", re.IGNORECASE)  # ON_STOP=terminate too
NEGATION = re.compile(r"\b(?:not|never|avoid|instead of|rather than|without)\b", re.IGNORECASE)
WARNING_AFTER = re.compile(r"^\W*(?:or\s+\S+\s+)?(?:would|kills?|SIGKILLs?)\b")
ANALOGY_BEFORE = re.compile(r"\bas\s+(?:systemd's\s+)?`?$")
ANALOGY_AFTER = re.compile(r"^`?\s+does\b")
CLAUSE_END = re.compile(r"(?<=[.;:])\s+")

FENCE = re.compile(r"^(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")

PIP_INSTALL = re.compile(r"\bpip3?\s+install\b([^`\n#|;&)]*)")
# pip options that take a value, which is then no requirement.
VALUED = frozenset(
    {
        "-c",
        "--constraint",
        "-r",
        "--requirement",
        "-f",
        "--find-links",
        "-i",
        "--index-url",
        "--extra-index-url",
        "-t",
        "--target",
        "--prefix",
        "--root",
        "--src",
        "--cache-dir",
        "--log",
        "--report",
        "--upgrade-strategy",
        "--python-version",
        "--platform",
    }
)
PACKAGE = "async-local-executor"
WHEEL = re.compile(r"(?:^|/)([A-Za-z0-9_.]+)-([^-]+)-py3-none-any\.whl(?:\[([^\]]*)\])?$")


def blocks(text: str) -> list[str]:
    """The page's blocks, each on one line with its whitespace collapsed."""
    found: list[str] = []
    current: list[str] = []
    fence = ""

    def flush() -> None:
        if current:
            found.append(" ".join(" ".join(current).split()))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if fence:
            current.append(stripped)
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                flush()
                fence = ""
            continue
        opening = FENCE.match(stripped)
        if opening:
            flush()
            fence = opening.group(1)
            current.append(stripped)
        elif not stripped:
            flush()
        elif stripped.startswith(("|", "#")):
            flush()
            current.append(stripped)
            flush()
        elif LIST_ITEM.match(line):
            flush()
            current.append(stripped)
        else:
            current.append(stripped)
    flush()
    return found


def _compares_or_warns(clause: str, start: int, end: int) -> bool:
    before, after = clause[:start], clause[end:]
    return bool(
        (ANALOGY_BEFORE.search(before) and ANALOGY_AFTER.match(after))
        or NEGATION.search(before)
        or WARNING_AFTER.match(after)
    )


def kill_mode_recommendations(text: str) -> list[str]:
    """The blocks that recommend KillMode=mixed or control-group without on_stop = terminate."""
    flagged: list[str] = []
    for block in blocks(text):
        if not KILL_MODE.search(block) or TERMINATE.search(block):
            continue
        for clause in CLAUSE_END.split(block):
            if any(not _compares_or_warns(clause, m.start(), m.end()) for m in KILL_MODE.finditer(clause)):
                flagged.append(block)
                break
    return flagged


def _joined(text: str) -> str:
    return re.sub(r"\\\n\s*", " ", text)  # a shell line continued with a backslash


def _pyproject() -> tuple[str, frozenset[str]]:
    """The version and the extras pyproject.toml defines (read as text: tomllib is Python 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert version is not None
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = frozenset(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.MULTILINE))
    return version.group(1), extras


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_problems(text: str) -> list[str]:
    """What is wrong with each pip install instruction in the text."""
    version, extras = _pyproject()
    problems: list[str] = []
    for match in PIP_INSTALL.finditer(_joined(text)):
        command = f"pip install{match.group(1)}".strip()
        args = match.group(1)
        problems.extend(
            f"{command}: unquoted {word} (quote it: zsh reads the brackets as a glob)"
            for word in args.split()
            if "[" in word and word[0] not in "'\""
        )
        try:
            tokens = shlex.split(args)
        except ValueError as exc:
            problems.append(f"{command}: cannot be parsed ({exc})")
            continue
        local_index = "--no-index" in tokens
        skip = False
        for token in tokens:
            if skip:
                skip = False
                continue
            if token in VALUED:
                skip = True
                continue
            if token.startswith("-"):
                continue
            wheel = WHEEL.search(token)
            if wheel is not None:
                name, built, named = wheel.groups()
                if _normalized(name) == PACKAGE and built != version:
                    problems.append(f"{command}: pyproject.toml builds version {version}, not {built}")
                unknown = {e.strip() for e in (named or "").split(",") if e.strip()} - extras
                if _normalized(name) == PACKAGE and unknown:
                    problems.append(f"{command}: no extra {sorted(unknown)} in pyproject.toml")
                continue
            if token.startswith((".", "/", "~")) or "/" in token or "://" in token:
                continue  # a directory, an archive or a URL
            requirement = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", token)
            if requirement and _normalized(requirement.group()) == PACKAGE and not local_index:
                problems.append(
                    f"{command}: {PACKAGE} is on no package index; install from a checkout or a wheel"
                )
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_no_page_recommends_a_kill_mode_that_kills_handed_over_tasks(page: Path) -> None:
    assert kill_mode_recommendations(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_install_instruction_installs_from_a_checkout_or_a_wheel_quoted(page: Path) -> None:
    assert install_problems(page.read_text()) == []


OLD_MIGRATING = """\
3. Change the setting, in airflow.cfg or the environment of the scheduler and api-server:

   If you use systemd, this is also the moment to change the scheduler unit to `KillMode=mixed` and
   `TimeoutStopSec=100` ([operations.md](operations.md)), so that the bounded shutdown can run.
"""
OLD_TROUBLESHOOTING = """\
`end()` waits up to `shutdown_timeout` (60 s) for running workloads, then terminates the rest (SIGTERM,
`termination_grace_period`, SIGKILL): up to about 70 s by default, and those tasks fail with `executor
shut down: terminated (...)`. The service manager must wait longer than that: `TimeoutStopSec` and
`KillMode=mixed` in systemd (with the default `KillMode=control-group` systemd signals every task
process at once), `terminationGracePeriodSeconds` in Kubernetes. See [operations.md](operations.md).
"""
OLD_AIRFLOW2 = """\
- **After a crash of the scheduler** (kill -9, the OOM killer), Airflow 2's own DAG file processor
  manager keeps running. Run the scheduler
  under a service manager that kills the whole unit when the scheduler dies (the systemd unit in
  [operations.md](operations.md), `KillMode=mixed`), or kill those leftovers before the restart.
"""


@pytest.mark.parametrize(
    ("sample", "recommends"),
    [
        pytest.param(OLD_MIGRATING, True, id="migrating.md before the handover"),
        pytest.param(OLD_TROUBLESHOOTING, True, id="troubleshooting.md before the handover"),
        pytest.param(OLD_AIRFLOW2, True, id="airflow2.md before the handover"),
        pytest.param("```ini\n[Service]\nKillMode=mixed\nTimeoutStopSec=100\n```\n", True, id="a unit"),
        pytest.param("Set KillMode to control-group.\n", True, id="in words"),
        pytest.param(
            "Use `KillMode=mixed`.\n\nWith `on_stop = terminate`, tasks end with the scheduler.\n",
            True,
            id="terminate in the next paragraph is not together",
        ),
        pytest.param(
            "Use `KillMode=mixed`, not `KillMode=process`.\n", True, id="a negation after it is no warning"
        ),
        pytest.param(
            "Use `KillMode=mixed` with\n`on_stop = terminate`: tasks then end with the scheduler.\n",
            False,
            id="together in a paragraph",
        ),
        pytest.param(
            "```ini\n# With on_stop = terminate, use KillMode=mixed.\nKillMode=mixed\n```\n",
            False,
            id="together in a code block",
        ),
        pytest.param(
            "- restart once with `AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP=terminate`, where\n"
            "  `KillMode=mixed` suits too\n",
            False,
            id="together in a list item",
        ),
        pytest.param(
            "When a task's main process exits, kill whatever is left in its cgroup (processes it started "
            "and did not wait for, as systemd's KillMode=control-group does) and say how many.\n",
            False,
            id="configuration.md's analogy",
        ),
        pytest.param(
            "# KillMode=mixed or control-group would SIGKILL every task process once the scheduler has exited.\n",
            False,
            id="a warning",
        ),
        pytest.param("Do not use `KillMode=mixed` with the handover.\n", False, id="a negation"),
        pytest.param("Use `KillMode=process` (the unit above).\n", False, id="process"),
    ],
)
def test_the_kill_mode_rule_tells_recommendations_from_the_rest(sample: str, recommends: bool) -> None:
    assert bool(kill_mode_recommendations(sample)) is recommends


@pytest.mark.parametrize(
    ("sample", "wrong"),
    [
        pytest.param(
            "pip install async-local-executor[uvloop]   # or: pip install -e .", True, id="old README"
        ),
        pytest.param("$ pip install 'async-local-executor[uvloop]'", True, id="from an index, quoted"),
        pytest.param("pip install -U async_local_executor", True, id="from an index, underscores"),
        pytest.param("pip install .[uvloop]", True, id="unquoted extras"),
        pytest.param("pip install -e .[test]", True, id="unquoted editable extras"),
        pytest.param(
            "pip install dist/async_local_executor-0.1.0-py3-none-any.whl[uvloop]", True, id="unquoted wheel"
        ),
        pytest.param(
            "pip install 'dist/async_local_executor-9.9.9-py3-none-any.whl[uvloop]'",
            True,
            id="another version",
        ),
        pytest.param(
            "pip install 'dist/async_local_executor-0.1.0-py3-none-any.whl[fast]'",
            True,
            id="an unknown extra",
        ),
        pytest.param("pip install '.[uvloop]'", False, id="checkout"),
        pytest.param(
            "pip install --constraint constraints/airflow-3.3.2-py3.11.txt '.[uvloop]'",
            False,
            id="constrained",
        ),
        pytest.param(
            "pip install 'dist/async_local_executor-0.1.0-py3-none-any.whl[uvloop]'", False, id="wheel"
        ),
        pytest.param(
            "pip install --no-index --find-links dist 'async-local-executor[uvloop]'", False, id="local dir"
        ),
        pytest.param("pip install \\\n    '.[uvloop]'", False, id="continued line"),
        pytest.param("an editable install (`pip install -e`) whose build", False, id="prose"),
        pytest.param("a distribution was upgraded (pip install -U). The first starts", False, id="prose 2"),
        pytest.param(
            "pip install apache-airflow-providers-celery 'celery[redis]'", False, id="other packages"
        ),
    ],
)
def test_the_install_rule_tells_registry_and_unquoted_installs_from_the_rest(
    sample: str, wrong: bool
) -> None:
    assert bool(install_problems(sample)) is wrong
