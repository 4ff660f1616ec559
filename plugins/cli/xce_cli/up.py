"""``xce up``: a whole cluster on this machine, and ``xce up --demo``, a failover under load.

The cluster is real: controller candidates, workers, the scheduler and the API server are
separate ``xce run`` processes on loopback sharing one state directory and one config file
(written into that directory). Ctrl-C, SIGTERM or SIGHUP (or the end of the demo) kills every
job and stops every process it started, and removes its temporary directory unless
``--keep`` (a ``--state-dir`` is the caller's and is always kept).
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from xce_cli.embedded import Embedded

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived (a KeyboardInterrupt, so nothing on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Stopped` while the body runs.

    Installed explicitly, also over an inherited SIG_IGN: started in the background by a
    shell or a service manager, Python leaves SIGINT ignored and Ctrl-C would do nothing.
    """
    old = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """Ignore the stop signals while cleaning up: a second Ctrl-C must not leave half of it."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@click.command()
@click.option("--candidates", "-c", default=3, type=click.IntRange(1, 3), help="Controller candidates (1-3).")
@click.option("--workers", "-w", default=2, type=click.IntRange(0, 16), help="Workers posing as distinct hosts.")
@click.option("--api-port", default=0, type=click.IntRange(0, 65535), help="API server port (0: a free one).")
@click.option("--port", "base_port", default=0, type=click.IntRange(0, 65533),
              help="First controller candidate's port; the others follow (0: free ports).")
@click.option("--state-dir", type=click.Path(file_okay=False), help="Keep state here between runs.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (state, config, logs) at exit.")
@click.option("--demo", is_flag=True, help="Run the failover demo and exit with a summary.")
@click.option("--jobs", "njobs", default=30, type=click.IntRange(1, 10_000), help="Jobs the demo submits.")
def up(candidates: int, workers: int, api_port: int, base_port: int, state_dir: str | None, keep: bool,
       demo: bool, njobs: int) -> None:
    """Start a whole cluster on this machine (Ctrl-C stops it); --demo kills the primary under load."""
    from rich.console import Console

    console = Console()
    with stop_signals():
        root = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="xce-up-"))
        try:
            root.mkdir(parents=True, exist_ok=True)
            console.print(f"[bold]xce up[/]: state, config and logs in {root}")
            _run(Embedded(root, candidates, workers, api_port, base_port), console, demo, njobs)
        finally:
            if state_dir is None and not keep:
                with signals_held():
                    shutil.rmtree(root, ignore_errors=True)
                console.print(f"removed {root} (--keep keeps it)")
            else:
                console.print(f"kept {root}")


def _run(emb: Embedded, console: Any, demo: bool, njobs: int) -> None:
    from rich.progress import Progress

    try:
        with Progress(console=console, transient=True) as progress:
            emb.start(progress)
        console.print(f"cluster up: {emb.cluster.ncandidates} candidate(s), {emb.nworkers} worker(s), "
                      "scheduler, API server")
        if demo:
            from xce_cli.demo import run_demo

            if not run_demo(emb, njobs, console):
                raise SystemExit(1)
            return
        _show_live(emb, console)
    except Stopped as stop:
        console.print(f"{signal.Signals(stop.signum).name}: stopping")
    finally:
        with signals_held():
            console.print("killing jobs and stopping every process")
            report = emb.close()
        console.print(report)


def _show_live(emb: Embedded, console: Any) -> None:
    from rich.live import Live

    url = emb.api_url()
    console.print(
        f"API:     {url}\n"
        f"admin password in {emb.password_file} (readable by you only)\n"
        "log in:  curl -s -X POST " + url + "/auth/logon -H 'content-type: application/json' "
        f"-d \"{{\\\"username\\\": \\\"admin\\\", \\\"password\\\": \\\"$(cat {emb.password_file})\\\"}}\"\n"
        "submit:  curl -s -X POST " + url + "/jobs -H 'authorization: Bearer TOKEN' "
        "-H 'content-type: application/json' -d '{\"command\": \"sleep 5\"}'\n"
        f"or:      XCE_CONFIG={emb.cluster.config_path} xce submit -- sleep 5\n"
        "Ctrl-C stops the cluster."
    )
    with Live(emb.status_table(), console=console, refresh_per_second=2) as live:
        while True:
            time.sleep(1.0)
            live.update(emb.status_table())
