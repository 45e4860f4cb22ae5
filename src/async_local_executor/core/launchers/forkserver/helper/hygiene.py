"""What a fork-server child must not inherit from the helper's imports: generators' states, descriptors.

A module imported in the helper runs once, and every workload forked afterwards starts from the memory
it left. A random generator seeded from the OS at import is then one state shared by every workload, so
every task would draw the same numbers, where a freshly started task seeds its own. Two measures keep a
forked task's draws its own:

- in the child, before any workload code, the generators known to be seeded from the OS at import are
  seeded again from the OS: Python's ``random`` does it itself at fork; NumPy's legacy global generator
  (``numpy.random.rand``, ``DataFrame.sample`` without a seed) is done here;
- in the helper, a learned module whose import creates any other generator, or changes the state of
  NumPy's global one, is refused (:class:`ImportWatch`): nothing can tell a generator seeded from
  the OS from one a library seeded on purpose with a constant, so neither is reseeded, and the task
  imports that module itself, exactly as a fresh one does.

Process-wide state: whatever an import sets for the whole process (signal handlers, the environment,
the working directory, the umask, ``sys.path``, the locale, the recursion limit, the default socket
timeout, the root logger, the interpreter's hooks, or a standard function replaced by another, as
gevent's monkey-patching does) would reach every task of every DAG, where a fresh task sees it only if
it imports that module itself. A learned module whose import changes any of it is refused, naming what
changed. Warnings filters are the exception: Airflow parses a DAG file inside
``warnings.catch_warnings()``, so the filters a library adds when a DAG file imports it never reach the
task; the helper removes the ones its learned imports added (:func:`kept_warnings_filters`), so a
forked task holds the filters a fresh one does.

Descriptors: a child closes every descriptor from 3 up (the helper's channel and other requests' are
none of its business), so an object a learned module made at import around one (a log file handler, a
socket, a selector) would keep a number the task's own next ``open()`` reuses, and write into the
task's file. A learned module whose import leaves a descriptor open is refused for that.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
from collections.abc import Iterator
from typing import Any, cast

# How each refusal of this module's begins; the launcher tells by them a refusal that is the same on
# every try (what the module does at import) from one that may pass.
SHARED_GENERATOR = "importing it seeds a random generator every task would share"
PROCESS_STATE = "importing it changes what every task would observe"
OPEN_DESCRIPTORS = "importing it leaves descriptors open that a task's own files would reuse"
REFUSALS = (SHARED_GENERATOR, PROCESS_STATE, OPEN_DESCRIPTORS)


def reseed_inherited() -> None:
    """In a forked child: seed again from the OS what the helper's imports seeded from the OS."""
    numpy_random = sys.modules.get("numpy.random")
    seed = getattr(numpy_random, "seed", None)
    if not callable(seed):
        return
    try:
        seed()  # no argument: from the OS, as NumPy seeds its global generator when first imported
    except Exception as exc:  # noqa: BLE001 - the task still runs; its log says its draws are shared
        print(f"fork server: could not reseed numpy.random's global generator: {exc!r}", file=sys.stderr)


def _generator_types() -> tuple[type, ...]:
    types: list[type] = [random.Random]
    numpy_random = sys.modules.get("numpy.random")
    for name in ("RandomState", "Generator", "BitGenerator"):
        kind = getattr(numpy_random, name, None)
        if isinstance(kind, type):
            types.append(kind)
    return tuple(types)


def _numpy_global() -> tuple[object, ...]:
    """NumPy's global generator and its bit generator (reseeded in each child), when loaded."""
    mtrand = sys.modules.get("numpy.random.mtrand")
    state = getattr(mtrand, "_rand", None)
    if state is None:
        return ()
    return (state, getattr(state, "_bit_generator", None))


def _numpy_global_state() -> object:
    state = _numpy_global()
    if not state:
        return None
    try:
        return repr(state[0].get_state(legacy=False))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a NumPy without it: its state cannot be compared
        return None


@contextlib.contextmanager
def kept_warnings_filters() -> Iterator[None]:
    """Whatever the block's imports add to the warnings filters is removed when it ends."""
    import warnings

    filters = cast("list[Any]", warnings.filters)  # a list, though typed as a sequence
    saved = list(filters)
    try:
        yield
    finally:
        filters[:] = saved
        mutated = getattr(warnings, "_filters_mutated", None)
        if callable(mutated):
            mutated()  # the C accelerator caches the filters' version


# Functions a monkey-patching library replaces: module -> attributes.
_PATCHABLE = {
    "socket": ("socket", "create_connection", "getaddrinfo"),
    "ssl": ("SSLContext", "create_default_context", "_create_default_https_context"),
    "threading": ("Thread", "Lock", "RLock", "Event"),
    "time": ("sleep",),
    "select": ("select", "poll", "epoll"),
    "os": ("fork", "waitpid", "read", "write"),
    "subprocess": ("Popen",),
    "builtins": ("open", "__import__"),
    "queue": ("Queue",),
}


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def observable() -> dict[str, object]:
    """Process-wide state a task could observe, as far as the modules loaded so far define it."""
    import signal

    state: dict[str, object] = {
        "signal handlers": {
            int(s): signal.getsignal(s)
            for s in signal.valid_signals()
            if s not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "the environment": dict(os.environ),
        "the working directory": os.getcwd(),
        "the umask": _umask(),
        "sys.path": list(sys.path),
        "the recursion limit": sys.getrecursionlimit(),
        "the interpreter's hooks": (sys.excepthook, sys.displayhook, sys.breakpointhook, sys.unraisablehook),
    }
    if (locale := sys.modules.get("locale")) is not None:
        with contextlib.suppress(Exception):
            state["the locale"] = locale.setlocale(locale.LC_ALL)
    if (socket := sys.modules.get("socket")) is not None:
        state["the default socket timeout"] = socket.getdefaulttimeout()
    if (logging := sys.modules.get("logging")) is not None:
        root = logging.getLogger()
        state["the root logger"] = (root.level, tuple(root.handlers), root.manager.disable)
    for module_name, names in _PATCHABLE.items():
        if (module := sys.modules.get(module_name)) is not None:
            for name in names:
                if hasattr(module, name):
                    state[f"{module_name}.{name}"] = getattr(module, name)
    return state


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """What differs; only what existed before counts (a module loaded meanwhile brings its own)."""
    found = []
    for key, value in before.items():
        if key not in after:
            continue
        new = after[key]
        if key == "the environment" and isinstance(value, dict) and isinstance(new, dict):
            names = sorted(k for k in value.keys() | new.keys() if value.get(k) != new.get(k))
            if names:
                found.append(f"the environment ({', '.join(names[:4])})")
        elif key == "signal handlers" and isinstance(value, dict) and isinstance(new, dict):
            signums = sorted(s for s in value if value[s] is not new.get(s) and value[s] != new.get(s))
            if signums:
                found.append("signal handlers (" + ", ".join(_signal_name(s) for s in signums[:4]) + ")")
        elif isinstance(value, (list, dict, tuple, int, str, float)) or value is None:
            if value != new:
                found.append(key)
        elif value is not new:
            found.append(f"{key} (replaced)" if "." in key else key)
    return found


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _descriptors() -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except (OSError, ValueError):
            continue  # the listing's own descriptor, closed by now
    return found


class ImportWatch:
    """Says what an import did that a forked task must not inherit: generators made, descriptors left open.

    Objects that exist before :meth:`watching` are frozen (moved out of the collector's generations)
    and the collector is paused while the import runs, so the youngest generation then holds exactly
    what the import created: looking at it costs as much as the import allocated, not the whole heap.
    :meth:`release` gives every object back to the collector.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self.problems = []
        before = _numpy_global_state()
        descriptors = _descriptors()
        state = observable()
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            yield
        finally:
            try:
                kinds = _generator_types()
                exempt = {id(o) for o in _numpy_global() if o is not None}
                created = sorted(
                    {
                        f"{type(o).__module__}.{type(o).__qualname__}"
                        for o in gc.get_objects(generation=0)
                        if isinstance(o, kinds)
                        and not isinstance(o, random.SystemRandom)
                        and id(o) not in exempt
                    }
                )
                if before is not None and _numpy_global_state() != before:
                    created.append("a new state of numpy.random's global generator")
                if created:
                    self.problems.append(f"{SHARED_GENERATOR}: " + ", ".join(created))
                if altered := changed(state, observable()):
                    self.problems.append(f"{PROCESS_STATE}: " + ", ".join(altered))
                opened = {
                    fd: target for fd, target in _descriptors().items() if descriptors.get(fd) != target
                }
                if opened:
                    shown = ", ".join(f"{fd} ({target})" for fd, target in sorted(opened.items())[:4])
                    self.problems.append(f"{OPEN_DESCRIPTORS}: " + shown)
            finally:
                if enabled:
                    gc.enable()

    @staticmethod
    def release() -> None:
        gc.unfreeze()
