"""``xce up``: a whole cluster on this machine, and ``xce up --demo``, a failover under load.

The cluster is real: controller candidates, workers, the scheduler and the API server are
separate ``xce run`` processes on loopback sharing one state directory and one config file
(written into that directory). Ctrl-C (or the end of the demo) stops every process it started.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click

from xce_cli.embedded import Embedded


@click.command()
@click.option("--candidates", "-c", default=3, type=click.IntRange(1, 3), help="Controller candidates (1-3).")
@click.option("--workers", "-w", default=2, type=click.IntRange(0, 16), help="Workers posing as distinct hosts.")
@click.option("--api-port", default=0, type=click.IntRange(0, 65535), help="API server port (0: a free one).")
@click.option("--port", "base_port", default=0, type=click.IntRange(0, 65533),
              help="First controller candidate's port; the others follow (0: free ports).")
@click.option("--state-dir", type=click.Path(file_okay=False), help="Keep state here between runs.")
@click.option("--demo", is_flag=True, help="Run the failover demo and exit with a summary.")
@click.option("--jobs", "njobs", default=30, type=click.IntRange(1, 10_000), help="Jobs the demo submits.")
def up(candidates: int, workers: int, api_port: int, base_port: int, state_dir: str | None, demo: bool,
       njobs: int) -> None:
    """Start a whole cluster on this machine (Ctrl-C stops it); --demo kills the primary under load."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console()
    root = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="xce-up-"))
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]xce up[/]: state, config and logs in {root}")
    emb = Embedded(root, candidates, workers, api_port, base_port)
    try:
        with Progress(console=console, transient=True) as progress:
            emb.start(progress)
        console.print(f"cluster up: {candidates} candidate(s), {workers} worker(s), scheduler, API server")
        if demo:
            from xce_cli.demo import run_demo

            ok = run_demo(emb, njobs, console)
            if not ok:
                raise SystemExit(1)
            return
        _show_live(emb, console)
    finally:
        emb.close()
        console.print("all processes stopped")


def _show_live(emb: Embedded, console: Any) -> None:
    from rich.live import Live

    url = emb.api_url()
    console.print(
        "log in:  curl -s -X POST " + url + "/auth/logon -H 'content-type: application/json' "
        f"-d '{{\"username\": \"admin\", \"password\": \"{emb.password}\"}}'\n"
        "submit:  curl -s -X POST " + url + "/jobs -H 'authorization: Bearer TOKEN' "
        "-H 'content-type: application/json' -d '{\"command\": \"sleep 5\"}'\n"
        f"or:      XCE_CONFIG={emb.cluster.config_path} xce submit -- sleep 5\n"
        "Ctrl-C stops the cluster."
    )
    try:
        with Live(emb.status_table(), console=console, refresh_per_second=2) as live:
            while True:
                time.sleep(1.0)
                live.update(emb.status_table())
    except KeyboardInterrupt:
        console.print("stopping")
