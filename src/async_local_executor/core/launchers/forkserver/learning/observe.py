"""Records, from inside a workload process, the modules it loads that its parent had not loaded.

A task that imports pandas pays for it in every run; the fork server can pay once instead, but only if
it learns the name. An audit hook (``sys.addaudithook``) sees every module the import system loads, in
this process and in every process forked from it (the task SDK and ``tasks run --local`` fork the
task's own process). Only the standard library is imported: this runs in each workload before anything
of it starts.

Recorded: a top-level module, and a submodule of a package that was not first loaded by this process
(an Airflow provider's hook module, a lazily imported part of an already preloaded library). Not
recorded: the submodules a newly loaded package loads itself, which importing the package again brings
back. Each name is appended, on its own line, to ``<directory>/<pid>`` (opened for each write, so the
launcher may remove the file at any time): a workload that imports nothing new writes nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def recorder(directory: str) -> Callable[[str, tuple[object, ...]], None]:
    """The audit hook that appends what this process (or a fork of it) loads to ``directory``."""
    # Nothing of what the process holds is copied or even looked at here: in a process forked from a
    # helper, touching every module's name (to copy sys.modules, say) would write to the pages of each,
    # and the kernel would copy them all (megabytes per task) for a set of names.
    new_roots: set[str] = set()  # packages first loaded after the hook: their own imports are theirs
    seen: set[str] = set()

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event != "import":
            return
        name = args[0]
        # The import system raises this event only for a module not loaded yet.
        if not isinstance(name, str) or name in seen:
            return
        seen.add(name)
        root, dot, _ = name.partition(".")
        if not dot:
            new_roots.add(root)
        elif root in new_roots:
            return
        elif root not in sys.modules:
            new_roots.add(root)  # `import pkg.mod` of a new package: asked for first, recorded as asked
        try:
            fd = os.open(os.path.join(directory, str(os.getpid())), _FLAGS, 0o600)
        except OSError:
            return  # learning is an optimisation: a full disk or a removed directory costs nothing else
        try:
            os.write(fd, f"{name}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    return hook


def install(directory: str) -> None:
    """Record from now on what this process and its forks load (an audit hook cannot be removed)."""
    sys.addaudithook(recorder(directory))


def read(directory: str) -> list[str]:
    """Every name recorded so far, in the order first recorded; the files read are removed."""
    names: dict[str, None] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        # Moved aside before it is read: a line written meanwhile goes to a new file, read next time.
        taken = f"{entry.path}.taken"
        try:
            os.rename(entry.path, taken)
            with open(taken, encoding="utf-8", errors="replace") as f:
                data = f.read()
            os.unlink(taken)
        except OSError:
            continue
        names.update(dict.fromkeys(line.strip() for line in data.splitlines() if line.strip()))
    return list(names)
