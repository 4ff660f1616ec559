"""Many simulated workers in one process: light ``Client``s joined as role ``worker``.

Started by ``bench_storm.py`` (several of these processes, none of them the controller)::

    python benchmarks/simworkers.py --config XCE.toml --first 0 --count 2500 [--prefix sim]

Each simulated worker is a real :class:`xcecore.client.Client` with its own TCP connection,
joining as ``worker@<prefix><n>`` with realistic attributes (unique ``hname``, ncpus, maxmem,
type, model, resources) and heartbeating every ``--heartbeat`` seconds through the core's own
heartbeat loop; reconnect and re-join after a failover are the core's, untouched. All of them
share one event loop.

Protocol on stdin/stdout (one line each): it prints ``ready <joined> <seconds> <cpu seconds>`` once every
client has joined (or ``--join-timeout`` passed); then ``dump PATH`` writes a JSON report to
PATH and prints ``ok``; ``probe SECONDS`` times heartbeats of random clients for that long
(steady-state latency) and prints ``rtt [ms, ...]``; ``quit`` (or end of input) closes every client and
exits.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import anyio

REJOINED = "rejoined"


class SimHooks:
    """Per-client hooks: the built-in rejoin behaviour plus timestamps of (re)joins."""

    __slots__ = ("rejoined", "states")

    def __init__(self) -> None:
        self.rejoined: list[float] = []
        self.states: dict[str, int] = {}

    def reconnected(self, client: Any, candidate: Any) -> None:
        """Mark a re-join pending (the ``xce_reconnected`` contract)."""
        client.mark_rejoin_pending()

    def connection_state(self, client: Any, state: str, candidate: Any, detail: str) -> None:
        """Count state changes; remember when each re-join happened."""
        self.states[state] = self.states.get(state, 0) + 1
        if state == REJOINED:
            self.rejoined.append(time.time())

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> None:
        """A worker's pushes (its state, its host) need no handling here."""


def attrs_for(n: int, prefix: str) -> dict[str, Any]:
    """Realistic, varied join attributes for simulated host ``n``."""
    rnd = random.Random(n)
    ncpus = rnd.choice([8, 16, 32, 64, 128])
    return {
        "hname": f"{prefix}{n:05d}", "ncpus": ncpus, "max_slots": ncpus,
        "maxmem": rnd.choice([32768, 65536, 262144, 524288]), "maxswp": 8192, "maxtmp": 102400,
        "type": rnd.choice(["X86_64", "X86_64", "X86_64", "ARM64"]),
        "model": rnd.choice(["XeonGold6348", "Epyc7763", "Graviton3"]), "cpuf": 1.0,
        "ncores": ncpus // 2, "nthreads": ncpus,
        "resources": rnd.choice([[], ["gpu"], ["gpu", "nvme"], ["ib"]]),
        "rack": f"r{n // 40:03d}",
    }


async def serve(args: argparse.Namespace) -> None:
    """Join every client, then answer commands on stdin until ``quit``."""
    from xcecore.client import Client
    from xcecore.runtime import client_config, load

    _, config = load(args.config)
    base = client_config(config, "worker@sim")
    hooks = [SimHooks() for _ in range(args.count)]
    joined_at: list[float | None] = [None] * args.count
    clients: list[Any] = [None] * args.count
    stop = anyio.Event()
    settled = anyio.Event()
    finished = [0]
    t_start = time.time()

    async def run_one(i: int) -> None:
        # Workers start spread over --spread seconds, so their heartbeat phases are spread
        # like a real cluster's (all at the same instant would align every heartbeat).
        await anyio.sleep(args.spread * i / args.count)
        n = args.first + i
        cfg = base.replace(
            sender=f"worker@{args.prefix}{n:05d}", heartbeat_interval=args.heartbeat,
            liveness_timeout=args.liveness, connect_timeout=args.connect_timeout,
            backoff_base=args.backoff_base, backoff_cap=args.backoff_cap)
        async with Client(cfg, role="worker", hooks=hooks[i], join_attrs=attrs_for(n, args.prefix),
                          rejoin_points=("hello",)) as client:
            clients[i] = client
            try:
                with anyio.move_on_after(args.join_timeout):
                    await client.connect()
                    await client.join()
                    joined_at[i] = time.time()
            finally:
                finished[0] += 1
                if finished[0] == args.count:
                    settled.set()
            await stop.wait()

    async with anyio.create_task_group() as tg:
        for i in range(args.count):
            tg.start_soon(run_one, i)
        await settled.wait()
        done = sum(1 for t in joined_at if t is not None)
        gc.freeze()  # every client is set up: keep the collector off them from now on
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(f"ready {done} {time.time() - t_start:.3f} {ru.ru_utime + ru.ru_stime:.3f}", flush=True)
        await commands([c for c in clients if c is not None], hooks, joined_at, t_start)
        stop.set()


async def commands(clients: list[Any], hooks: list[SimHooks], joined_at: list[float | None],
                   t_start: float) -> None:
    """Answer ``dump``/``probe``/``quit`` lines from stdin."""
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line or line.strip() == "quit":
            return
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "dump":
            report = {
                "count": len(clients), "start": t_start, "joined_at": joined_at,
                "connected": sum(1 for c in clients if c.connected),
                "rejoined": [h.rejoined for h in hooks],
                "states": _sum_states(hooks),
                "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
            Path(arg).write_text(json.dumps(report))
        elif cmd == "probe":
            rtts = await probe(clients, float(arg))
            print("rtt " + json.dumps(rtts), flush=True)
            continue
        print("ok", flush=True)


async def probe(clients: list[Any], seconds: float) -> list[float]:
    """Heartbeat round trips (ms) of random clients, ten a second, for ``seconds``."""
    rtts: list[float] = []
    end = time.monotonic() + seconds
    rnd = random.Random()
    while time.monotonic() < end:
        c = rnd.choice(clients)
        t0 = time.perf_counter()
        with contextlib.suppress(Exception):
            await c.call("heartbeat", deadline=5.0)
            rtts.append((time.perf_counter() - t0) * 1e3)
        await anyio.sleep(0.1)
    return rtts


def _sum_states(hooks: list[SimHooks]) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in hooks:
        for k, v in h.states.items():
            out[k] = out.get(k, 0) + v
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, raise the open-file limit, and run the clients."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--prefix", default="sim")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--liveness", type=float, default=4.0)
    ap.add_argument("--connect-timeout", type=float, default=5.0)
    ap.add_argument("--backoff-base", type=float, default=0.1)
    ap.add_argument("--backoff-cap", type=float, default=5.0)
    ap.add_argument("--join-timeout", type=float, default=300.0)
    ap.add_argument("--log-level", default="ERROR", help="client library log level (stderr)")
    ap.add_argument("--spread", type=float, default=1.0,
                    help="start the clients evenly over this many seconds (default 1)")
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.count * 2 + 256)), hard))
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    # Thousands of clients in one process make a heap no real worker has; the collector's
    # re-scans of it would be the simulator's cost, not the client library's (the controller
    # runs with these thresholds too).
    from xce_controller.plugin import GC_THRESHOLDS

    gc.set_threshold(*GC_THRESHOLDS)
    from xcecore.runtime import load, loop_options

    _, config = load(args.config)  # the same event loop as the role processes of this cluster
    anyio.run(serve, args, backend_options=loop_options(config.cluster.get("event_loop") or "auto"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
