"""``async-local-executor status``: what each executor on this host is doing, from its status file.

Also reachable as ``airflow async-local-executor status`` where Airflow loads the executor's CLI
commands (:meth:`AsyncLocalExecutor.get_cli_commands`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from async_local_executor.ops import state_dir
from async_local_executor.ops.cli_options import STATUS_HELP, STATUS_OPTIONS
from async_local_executor.ops.status import ADOPTION_ADOPTED, ADOPTION_HELD, Found, read_all
from async_local_executor.ops.status_read import adoption_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option in STATUS_OPTIONS:
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


def parser() -> argparse.ArgumentParser:
    """The ``async-local-executor`` command line."""
    top = argparse.ArgumentParser(prog="async-local-executor")
    commands = top.add_subparsers(dest="command", required=True)
    add_arguments(commands.add_parser("status", help=STATUS_HELP))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    return status(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
