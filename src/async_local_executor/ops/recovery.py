"""What a starting executor does before it launches anything: clean up after a crashed predecessor.

Its journal names the processes it left running (see :mod:`~async_local_executor.ops.reclaim`), and its
status file still claims a running executor. Both go before the new instance launches anything, so no
try can run beside a survivor of its previous attempt. Nothing here knows Airflow.

What a predecessor handed over (or left running, with handover on, when it crashed) is held instead:
the new instance's journal is opened first, so that each held workload is recorded in it as a launch of
its own before the dead journal goes (a crash of the new instance hands it on again), and its custody
file (``<state_dir>/custody/<pid>-<start>.json``) names this process, which stops the workload's
countdown. Custody files of workloads that no longer run and that no live executor answers for go.

What is in the directory never makes this raise (a file it cannot read is skipped with a warning); the
directory itself does, when another user could write into it or pick it (:func:`state_dir.secure`). It is
opened and checked once, and worked through that descriptor, not by resolving its path again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from async_local_executor.ops import custody_dir, journal, state_dir, status
from async_local_executor.ops.reclaim import Held, ReclaimResult, reclaim

__all__ = ["Held", "Recovered", "reclaim_since", "reclaim_then_open"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """A starting executor's journal, and the workloads a stopped predecessor left it to adopt."""

    journal: journal.LaunchJournal
    held: list[Held]
    """Recorded in :attr:`journal` as open launches; their custody files name this process."""
    custody: Path
    """The custody directory (``<state_dir>/custody``, 0700)."""
    reclaimed: frozenset[str] = frozenset()
    """The dead instances whose journals were reclaimed here: what of theirs runs on was judged."""


def reclaim_then_open(
    directory: Path, *, owner: str, owner_key: str = "", companions: Sequence[journal.Companion] = ()
) -> Recovered:
    """Open this executor's journal, kill what dead executors left running and hold what they handed over.

    Their journals and status files go; stale custody files too.

    :param owner: who holds the new journal, for the log lines of the executor that reclaims it
    :param owner_key: whose workloads this executor holds (its deployment and team, see
        :func:`~async_local_executor.ops.reclaim.reclaim`); recorded in its journal
    :param companions: the owner's processes the next executor to reclaim the journal stops if they
        outlive it; recorded in its journal
    :raises state_dir.UnsafeStateDir: ``directory`` is another user's, writable by other users, a
        symbolic link, or was replaced while it was worked on (or its custody directory is not ours)
    """
    with state_dir.secure(directory) as folder:
        # The journal, the custody directory and the status file are created by path: not where
        # another directory now is.
        folder.check_named()
        custody = custody_dir.ensure(folder)
        launches = journal.LaunchJournal.open(
            directory, owner=owner, owner_key=owner_key, companions=companions
        )
        try:
            result = _clean_up(folder, launches, custody, owner_key)
        except BaseException:
            launches.hand_on()  # what it holds already stays on record for the next start
            raise
        return Recovered(launches, result.held, custody, frozenset(result.instances))


def reclaim_since(
    directory: Path,
    launches: journal.LaunchJournal,
    *,
    owner_key: str = "",
    wanted: Callable[[Mapping[str, object]], bool] | None = None,
) -> list[Held]:
    """What a running executor holds of the journals that died since it started (or since it last looked).

    A predecessor still inside its stop when this executor started, or another scheduler of the same
    deployment and team that stopped since (high availability), hands its running workloads over to
    whoever reclaims its journal next: without this, nobody would until the next start, and they would
    expire. Also kills what such a journal left that is not held, as a start does, without waiting
    for them to be gone (it runs on the scheduler's thread; the next start finds any still there).
    Never raises: what goes wrong is logged, and the next call tries again.

    :param wanted: only a journal one of whose handed-over workloads' data this accepts is taken
    """
    try:
        with state_dir.secure(directory) as folder:
            custody = custody_dir.ensure(folder)
            return _reclaim_journals(folder, launches, custody, owner_key, wanted, timeout=0.0).held
    except Exception:
        log.exception("cannot reclaim the journals of executors that stopped since this one started")
        return []


def _clean_up(
    folder: state_dir.StateDir, launches: journal.LaunchJournal, custody: Path, owner_key: str
) -> ReclaimResult:
    result = _reclaim_journals(folder, launches, custody, owner_key)
    for name in custody_dir.remove_stale(custody):
        log.info("removed the custody files of %s, which no longer runs", name)
    for found in status.read_all(folder):
        if found.gone:  # a crashed scheduler's last word, and any write of it cut short
            name = found.path.name
            cut_short = [n for n in folder.names() if n.startswith(f"{name}{status.TMP_INFIX}")]
            for each in [name, *cut_short]:
                try:
                    folder.unlink(each, missing_ok=True)
                except OSError as exc:
                    log.warning(
                        "cannot remove %s, a stopped executor's status file: %s", folder.shown(each), exc
                    )
    return result


def _reclaim_journals(
    folder: state_dir.StateDir,
    launches: journal.LaunchJournal,
    custody: Path,
    owner_key: str,
    wanted: Callable[[Mapping[str, object]], bool] | None = None,
    *,
    timeout: float = 10.0,
) -> ReclaimResult:
    def take_over(held: list[Held]) -> None:
        # Journalled first: once this process names itself, a crash of it must leave a record of them.
        for each in held:
            launches.hold(each)
        for each in held:
            try:
                custody_dir.name_owner(custody, each.pid, each.start)
            except OSError as exc:
                log.warning(
                    "cannot name this scheduler the owner of pid %d (%s) in %s: it kills itself %gs after "
                    "its owner's death unless another does: %s",
                    each.pid,
                    each.key,
                    custody,
                    each.timeout,
                    exc,
                )

    result = reclaim(folder, hold=take_over, owner_key=owner_key, wanted=wanted, timeout=timeout)
    survivors = result.killed
    for survivor in survivors:
        log.warning(
            "killed pid %d (%s) left running by a stopped executor (%s): %s",
            survivor.pid,
            survivor.label or "started by one of its workloads",
            survivor.owner,
            survivor.command,
        )
    if survivors:
        log.warning(
            "killed %d process(es) a previous executor left running; the scheduler resets their "
            "task instances and retries decide what runs again",
            len(survivors),
        )
    for one in result.held:
        log.info(
            "holding pid %d (%s), %s (%s), for its task instance's adoption",
            one.pid,
            one.key,
            "left running by a crashed executor" if one.crashed else "handed over by a stopped executor",
            one.owner,
        )
    return result
