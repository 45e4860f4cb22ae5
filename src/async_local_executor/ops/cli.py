"""``async-local-executor``: ``status``, what each executor on this host is doing, from its status file;
``pause``, ``resume``, ``drain`` and ``resize``, live control of the running executors
(:mod:`~async_local_executor.ops.control`).

Also reachable as ``airflow async-local-executor <command>`` where Airflow loads the executor's CLI
commands (:meth:`AsyncLocalExecutor.get_cli_commands`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from async_local_executor.ops import control, state_dir
from async_local_executor.ops.cli_options import COMMANDS, STATUS_OPTIONS, Command
from async_local_executor.ops.control import Control, ControlError, NotRunning
from async_local_executor.ops.status import ADOPTION_ADOPTED, ADOPTION_HELD, Found, read_all
from async_local_executor.ops.status_read import adoption_of


def add_arguments(parser: argparse.ArgumentParser, command: Command | None = None) -> None:
    for option in command.options if command is not None else STATUS_OPTIONS:
        parser.add_argument(option.flag, help=option.help, **option.settings)


def status(args: argparse.Namespace) -> int:
    directory: Path = args.state_dir or state_dir.from_airflow_config()
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.check:
        return _check(read_all(directory))
    if args.json:
        print(json.dumps([dict(f.data, stale=f.stale) for f in read_all(directory)], indent=1))
        return 0
    if not args.watch:
        console.print(render(read_all(directory), directory))
        return 0
    try:
        if not console.is_terminal:
            # Piped or logged: one full report per period, each under a timestamp.
            while True:
                console.print(f"--- {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
                console.print(render(read_all(directory), directory))
                time.sleep(args.watch)  # the period the user asked for
        from rich.live import Live

        with Live(render(read_all(directory), directory), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.watch)  # the redraw period the user asked for
                live.update(render(read_all(directory), directory), refresh=True)
    except KeyboardInterrupt:
        return 0


def _check(found: list[Found]) -> int:
    if not found:
        print("no executor status found")
        return 2
    for f in found:
        health = f.data.get("health", {})
        print(
            f"{f.data.get('instance', '?')}: {f.stale or health.get('status')}"
            + (f": {health['reason']}" if not f.stale and health.get("reason") else "")
        )
    return 0 if all(f.healthy for f in found) else 1


# After a running workload's key: what its adoption is (see ops/status.py), if it was handed over.
_ADOPTION_MARK = {None: "", ADOPTION_HELD: " (held for adoption)", ADOPTION_ADOPTED: " (adopted)"}
COLUMNS = ("key", "pid", "queue", "age (s)", "memory (MB)", "peak (MB)", "CPU (s)")


def _number(value: object, form: str = "{}") -> str:
    # bool is an int too, but never a number in a status file
    return form.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def render(found: list[Found], directory: Path) -> Group | Text:
    if not found:
        return Text(f"no executor status in {directory} (is a scheduler with AsyncLocalExecutor running?)")
    parts: list[Table | Text] = []
    for f in found:
        data = f.data
        health = data.get("health", {})
        verdict = f"STALE: {f.stale}" if f.stale else str(health.get("status", "unknown")).upper()
        style = "red" if f.stale or health.get("status") != "healthy" else "green"
        try:
            written = f"{datetime.fromtimestamp(float(data.get('written_at', 0)), timezone.utc):%H:%M:%S} UTC"
        except (OverflowError, ValueError, OSError):
            written = "at an impossible time"
        team = f" team {data['team']}" if data.get("team") else ""
        running = data.get("running", [])
        head = Text.assemble(
            (f"{verdict}", f"bold {style}"),
            f"  scheduler pid {data.get('pid')}{team}, {data.get('launcher')} launcher, "
            f"{len(running)}/{data.get('parallelism')} slots used, {data.get('waiting', 0)} waiting, "
            f"loop lag {data.get('loop_lag_ms')} ms, written {written}",
        )
        parts.append(head)
        if health.get("reason"):
            parts.append(Text(f"  {health['reason']}", style=style))
        live = data.get("control")
        if isinstance(live, dict) and live.get("note"):
            parts.append(Text(f"  live control: {live['note']}; {_limits(live)}", style="yellow"))
            if live.get("overdue"):
                parts.append(
                    Text(
                        "  the drain passed its deadline while these ran: "
                        + (", ".join(map(str, live.get("still_running") or [])) or "none"),
                        style="red",
                    )
                )
        containment = data.get("containment")
        if isinstance(containment, dict) and containment.get("detail"):
            parts.append(Text(f"  containment: {containment['detail']}"))
        parts.extend(preload_lines(data.get("preload")))
        table = Table(box=None, pad_edge=False)
        for column in COLUMNS:
            table.add_column(column, justify="right" if column != "key" else "left")
        for w in running:
            table.add_row(
                str(w.get("key")) + _ADOPTION_MARK[adoption_of(w)],
                str(w.get("pid")),
                str(w.get("queue") or "-"),
                _number(w.get("age_s"), "{:.0f}"),
                _number(w.get("memory_mb")),
                _number(w.get("peak_mb")),
                _number(w.get("cpu_s")),
            )
        parts.append(table)
    return Group(*parts)


def preload_lines(preload: object) -> list[Text]:
    """What the fork server preloads beyond every task's needs, and what it refused and why."""
    if not isinstance(preload, dict):
        return []
    if preload.get("mode") == "explicit":
        return [
            Text(f"  preload (explicit): {', '.join(map(str, preload.get('modules') or [])) or 'nothing'}")
        ]
    loaded = [p for p in preload.get("preloaded") or [] if isinstance(p, dict)]
    shown = [
        f"{p.get('module')}"
        + (f" ({p['distribution']} {p.get('version') or '?'})" if p.get("distribution") else "")
        + (f" {p['kib'] / 1024:.0f} MiB" if isinstance(p.get("kib"), int) and p["kib"] >= 1024 else "")
        for p in loaded
    ]
    lines = [
        Text(
            f"  preload (auto): {len(loaded)} learned modules preloaded"
            + (": " + ", ".join(shown) if shown else "")
        )
    ]
    lines += [
        Text(f"    refused {r.get('module')}: {r.get('reason')}", style="yellow")
        for r in preload.get("refused") or []
        if isinstance(r, dict)
    ]
    if preload.get("pending"):
        lines.append(Text(f"    to try next: {', '.join(map(str, preload['pending']))}"))
    return lines


# Live control. Exit statuses: 0 applied by every running executor (drain --wait: drained); 1 none runs,
# or one did not apply it in time; 2 bad input (nothing changed); 3 drain --wait: the deadline came first.
NOT_APPLIED, BAD_INPUT, OVERDUE = 1, 2, 3


def pause(args: argparse.Namespace) -> int:
    return _change(args, lambda by, at: lambda _p, _q: control.pause(by, at))


def resume(args: argparse.Namespace) -> int:
    return _change(args, lambda by, at: lambda _p, _q: control.resume(by, at))


def drain(args: argparse.Namespace) -> int:
    code = _change(args, lambda by, at: lambda _p, _q: control.drain(by, at, args.deadline))
    if code or not args.wait:
        return code
    return _wait_drained(args)


def resize(args: argparse.Namespace) -> int:
    try:
        queues = dict(_queue_limit(item) for item in args.queue)
    except ControlError as exc:
        return _bad(exc)
    if args.parallelism is None and not queues:
        return _bad(ControlError("resize needs --parallelism N or --queue NAME=N"))
    return _change(
        args,
        lambda by, at: (
            lambda configured, configured_queues: control.resize(
                by,
                at,
                parallelism=args.parallelism,
                queues=queues,
                configured_parallelism=configured,
                configured_queues=configured_queues,
            )
        ),
    )


def _queue_limit(item: str) -> tuple[str, int]:
    name, sep, value = item.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, int(value)
    except ValueError:
        raise ControlError(f"--queue takes NAME=N with N a whole number, got {item!r}") from None


Edit = Callable[[int, Mapping[str, int]], Callable[[Control], Control]]


def _change(args: argparse.Namespace, make: Callable[[str, float], Edit]) -> int:
    directory: Path = args.state_dir or state_dir.from_airflow_config()
    by = args.by or getpass.getuser()
    try:
        done = control.request(directory, args.team, make(by, time.time()), timeout=args.timeout)
    except NotRunning as exc:
        print(exc, file=sys.stderr)
        return NOT_APPLIED
    except ControlError as exc:
        return _bad(exc)
    print(f"{args.command}: {done.control.describe()} (change {done.control.serial})")
    for _, fields in sorted(done.applied.items()):
        print(f"  scheduler pid {fields.get('pid')}: applied; {_limits(fields)}")
    for instance in done.pending:
        print(f"  executor {instance}: has not applied it within {args.timeout:g}s", file=sys.stderr)
    return NOT_APPLIED if done.pending else 0


def _bad(exc: Exception) -> int:
    print(f"error: {exc}; nothing was changed", file=sys.stderr)
    return BAD_INPUT


def _limits(fields: Mapping[str, object]) -> str:
    said = f"parallelism {fields.get('parallelism')} (configured {fields.get('configured_parallelism')})"
    live, configured = fields.get("queue_limits"), fields.get("configured_queue_limits")
    if isinstance(live, dict) and isinstance(configured, dict) and live:
        said += ", queue limits " + ", ".join(
            f"{name}:{value} (configured {configured.get(name)})" for name, value in sorted(live.items())
        )
    return said


def _wait_drained(args: argparse.Namespace) -> int:
    """Until each running executor of the team says drained, or that its drain passed its deadline."""
    directory: Path = args.state_dir or state_dir.from_airflow_config()
    shown: tuple[str, ...] | None = None
    try:
        while True:
            found = control.running(directory, args.team)
            fields = [f.data.get("control") or {} for f in found]
            if not found:
                print("drain: the executor stopped before it was drained", file=sys.stderr)
                return NOT_APPLIED
            overdue = [name for f in fields if f.get("overdue") for name in f.get("still_running") or []]
            if any(f.get("overdue") for f in fields):
                print(f"drain: the deadline passed while these still ran: {', '.join(overdue) or 'none'}")
                return OVERDUE
            if all(f.get("mode") == "drained" for f in fields):
                print("drained: no task runs or waits")
                return 0
            if any(f.get("mode") not in ("draining", "drained") for f in fields):
                print(
                    f"drain: ended by another change: {fields[0].get('note') or fields[0].get('mode')}",
                    file=sys.stderr,
                )
                return NOT_APPLIED
            still = tuple(sorted(str(row.get("key")) for f in found for row in f.data.get("running") or []))
            if still != shown:
                shown = still
                print(f"draining: {len(still)} still running: {', '.join(still) or '(launches finishing)'}")
            time.sleep(control.ACK_POLL * 5)  # how often the status files are looked at again
    except KeyboardInterrupt:
        print("stopped waiting; the drain goes on", file=sys.stderr)
        return NOT_APPLIED


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "status": status,
    "pause": pause,
    "resume": resume,
    "drain": drain,
    "resize": resize,
}


def run(args: argparse.Namespace) -> int:
    return HANDLERS[args.command](args)


def parser() -> argparse.ArgumentParser:
    """The ``async-local-executor`` command line."""
    top = argparse.ArgumentParser(prog="async-local-executor")
    commands = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        add_arguments(commands.add_parser(command.name, help=command.help, description=command.help), command)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
