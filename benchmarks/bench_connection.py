"""Benchmarks of the client (xcecore.client) on this machine.

(a) the post-call path with no rejoin pending, against a bare attribute read;
(b) requests/s over one multiplexed connection to a fake controller in another process,
    sequential and pipelined; and what the client adds per call on top of a bare wire client
    (the same requests written and read with ``xcecore.wire`` alone), in wall time and in this
    process's CPU time, the two alternating on the same fake so both see the same load;
(c) connect latency through a standby that redirects, against connecting directly;
(d) the blocking facade (``SyncClient``, the role runtime's form: a running client, a stop
    event): calls/s from one thread and from 8 threads.

Run: ``python benchmarks/bench_connection.py [--quick]``. Writes
``benchmarks/results/connection.json`` and ``benchmarks/results/connection.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from loguru import logger

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from xcecore.candidates import parse_peers  # noqa: E402
from xcecore.client import Client, ClientConfig  # noqa: E402

FAKECTL = ROOT / "tests" / "connection" / "fakectl.py"
RESULTS = ROOT / "benchmarks" / "results"


def summary(samples: list[float]) -> dict[str, float]:
    """Median, p90, p99, min and max of ``samples``."""
    s = sorted(samples)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]

    return {"median": statistics.median(s), "p90": pct(90), "p99": pct(99), "min": s[0],
            "max": s[-1], "n": len(s)}


@contextmanager
def fake_controllers(modes: str) -> Iterator[list[str]]:
    """Fake controllers in a child process (its own core); yields their addresses."""
    proc = subprocess.Popen([sys.executable, str(FAKECTL), "--modes", modes],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        yield [proc.stdout.readline().strip() for _ in modes.split(",")]
    finally:
        proc.terminate()
        proc.wait(10)


def config(*addresses: str) -> ClientConfig:
    return ClientConfig(candidates=parse_peers(",".join(addresses)), sender="bench@localhost",
                        heartbeat_interval=3600.0, liveness_timeout=30.0)


# ------------------------------------------------------------------------- (a)
def bench_post_call(repeats: int, number: int) -> dict[str, Any]:
    """ns per evaluation of the post-call check, nothing pending, vs. a bare attribute read."""
    client = Client(config("127.0.0.1:1"), role="scheduler", rejoin_points=["jobdispatch"])
    env = {"c": client, "op": "jobsubmit"}
    stmts = {
        # exactly the tail of Client.call: one attribute read when nothing is pending
        "post_call_inline": "if c._rejoin.pending and op in c.rejoin_points: pass",
        "post_call_function": "c.rejoin_due(op)",
        "bare_attribute_read": "c._rejoin.pending",
        "empty_loop": "pass",
    }
    out: dict[str, Any] = {}
    for name, stmt in stmts.items():
        runs = timeit.Timer(stmt, globals=env).repeat(repeat=repeats, number=number)
        out[name] = summary([r / number * 1e9 for r in runs])
    base = out["empty_loop"]["median"]
    out["net_ns"] = {k: out[k]["median"] - base for k in stmts if k != "empty_loop"}
    return out


# ------------------------------------------------------------------------- (b)
async def _latency(address: str, calls: int) -> list[float]:
    """Per-call round-trip times (µs), one call in flight."""
    out = []
    async with Client(config(address), role="bench") as c:
        await c.connect()
        for _ in range(200):
            await c.call("hello")  # warm up
        for _ in range(calls):
            started = time.perf_counter()
            await c.call("hello")
            out.append((time.perf_counter() - started) * 1e6)
    return out


async def _throughput(address: str, calls: int, in_flight: int, repeats: int) -> list[float]:
    rates = []
    async with Client(config(address), role="bench") as c:
        await c.connect()
        for _ in range(200):
            await c.call("hello")  # warm up
        for _ in range(repeats):
            per_task = calls // in_flight

            async def worker() -> None:
                for _ in range(per_task):  # noqa: B023
                    await c.call("hello")

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(in_flight):
                    tg.start_soon(worker)
            rates.append(per_task * in_flight / (time.perf_counter() - started))
    return rates


class RawWire:
    """A bare wire client: the handshake, then one request at a time, nothing else."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.ids = 0

    @classmethod
    async def connect(cls, address: str) -> RawWire:
        from anyio.streams.buffered import BufferedByteStream

        from xcecore import auth, wire

        host, _, port = address.rpartition(":")
        stream = BufferedByteStream(await anyio.connect_tcp(host, int(port)))
        hello = await wire.read_message(stream)
        await wire.write_message(stream, auth.client_answer(config(address).auth, "bench@raw", hello))
        status = await wire.read_message(stream)
        if status.get("ok") is not True:
            raise RuntimeError(f"raw handshake refused: {status}")
        return cls(stream)

    async def call(self, op: str) -> Any:
        from xcecore import wire

        self.ids += 1
        n = self.ids
        await self.stream.send(wire.encode({"id": n, "op": op, "args": {}, "rid": f"raw-{n}"}))
        while True:
            msg = await wire.read_message(self.stream)
            if msg.get("id") == n:
                return msg["result"]


async def _overhead(address: str, calls: int, repeats: int) -> dict[str, list[float]]:
    """Per-call wall and CPU (µs) of the client and of a bare wire client, alternating."""
    out: dict[str, list[float]] = {"client_wall_us": [], "raw_wall_us": [], "client_cpu_us": [],
                                   "raw_cpu_us": []}
    raw = await RawWire.connect(address)
    async with Client(config(address), role="bench") as c:
        await c.connect()
        for _ in range(200):  # warm up both
            await c.call("hello")
            await raw.call("hello")
        for _ in range(repeats):
            for name, call in (("client", c.call), ("raw", raw.call)):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    await call("hello")
                out[f"{name}_wall_us"].append((time.perf_counter() - wall) / calls * 1e6)
                out[f"{name}_cpu_us"].append((time.process_time() - cpu) / calls * 1e6)
    await raw.stream.aclose()
    return out


def bench_throughput(calls: int, repeats: int) -> dict[str, Any]:
    with fake_controllers("primary") as [address]:
        seq = anyio.run(_throughput, address, calls, 1, repeats)
        pipe = anyio.run(_throughput, address, calls, 64, repeats)
        rtt = anyio.run(_latency, address, calls)
        over = anyio.run(_overhead, address, calls // 2, repeats)
    added = {k: statistics.median(over[f"client_{k}_us"]) - statistics.median(over[f"raw_{k}_us"])
             for k in ("wall", "cpu")}
    return {"sequential_rps": summary(seq), "pipelined_64_rps": summary(pipe),
            "sequential_call_us": summary(rtt), "calls_per_run": calls,
            "vs_raw_wire": {k: summary(v) for k, v in over.items()},
            "client_adds_us_median": added}


# ------------------------------------------------------------------------- (d)
async def _blocking(address: str, calls: int, threads: int, repeats: int) -> list[float]:
    """Calls/s of ``SyncClient.call`` from ``threads`` threads on one running client."""
    from anyio.from_thread import BlockingPortal

    from xcecore.bridge import LoopBridge, StopEvent
    from xcecore.client import SyncClient

    bridge = LoopBridge()
    bridge.bind()
    rates = []
    try:
        async with Client(config(address), role="bench") as c, BlockingPortal() as portal:
            await c.connect()
            sync = SyncClient(c, portal, stop=StopEvent(bridge))

            def work(n: int) -> None:
                for _ in range(n):
                    sync.call("hello")

            await anyio.to_thread.run_sync(work, 200)  # warm up
            per = calls // threads
            for _ in range(repeats):
                started = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for _ in range(threads):
                        tg.start_soon(partial(anyio.to_thread.run_sync, work, per, limiter=None))
                rates.append(per * threads / (time.perf_counter() - started))
    finally:
        bridge.unbind()
    return rates


def bench_blocking(calls: int, repeats: int) -> dict[str, Any]:
    with fake_controllers("primary") as [address]:
        one = anyio.run(_blocking, address, calls, 1, repeats)
        eight = anyio.run(_blocking, address, calls, 8, repeats)
    return {"one_thread_rps": summary(one), "eight_threads_rps": summary(eight),
            "calls_per_run": calls}


# ------------------------------------------------------------------------- (c)
async def _connect_latency(addresses: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        async with Client(config(*addresses), role="bench") as c:
            started = time.perf_counter()
            await c.connect()
            out.append((time.perf_counter() - started) * 1000)
    return out


def bench_redirect(repeats: int) -> dict[str, Any]:
    with fake_controllers("standby,primary") as [standby, primary]:
        anyio.run(_connect_latency, [primary], 5)  # warm up
        direct = anyio.run(_connect_latency, [primary, standby], repeats)
        redirected = anyio.run(_connect_latency, [standby, primary], repeats)
    return {"direct_ms": summary(direct), "via_standby_redirect_ms": summary(redirected),
            "extra_ms_median": statistics.median(redirected) - statistics.median(direct)}


def _fmt(d: dict[str, float], unit: str, scale: Callable[[float], str]) -> str:
    return " | ".join(scale(d[k]) for k in ("median", "p90", "p99")) + f" | {unit}"


def write_markdown(res: dict[str, Any], path: Path) -> None:
    a, b, c, d = res["post_call"], res["throughput"], res["redirect"], res["blocking"]
    v = b["vs_raw_wire"]
    ns = lambda v: f"{v:.1f}"  # noqa: E731
    rps = lambda v: f"{v:,.0f}"  # noqa: E731
    ms = lambda v: f"{v:.2f}"  # noqa: E731
    lines = [
        "# Connection manager benchmarks",
        "",
        f"- date: {res['date']}",
        f"- machine: {res['cores']} cores, {res['platform']}, Python {res['python']}",
        f"- command: `{res['command']}`",
        "",
        "## (a) post-call path, no rejoin pending (per evaluation)",
        "",
        "| what | median | p90 | p99 | unit |",
        "|---|---|---|---|---|",
        *(f"| {k} | {_fmt(a[k], 'ns', ns)} |" for k in
          ("post_call_inline", "post_call_function", "bare_attribute_read", "empty_loop")),
        "",
        "Net of the empty loop (median): "
        + ", ".join(f"{k} {v:.1f} ns" for k, v in a["net_ns"].items())
        + ". `post_call_inline` is the exact tail of `Client.call`; with nothing pending it "
          "is one attribute read and a falsy test, and no hook is called.",
        "",
        f"## (b) requests/s over one connection ({b['calls_per_run']} calls per run)",
        "",
        "| mode | median | p90 | p99 | unit |",
        "|---|---|---|---|---|",
        f"| sequential (1 in flight) | {_fmt(b['sequential_rps'], 'req/s', rps)} |",
        f"| pipelined (64 in flight) | {_fmt(b['pipelined_64_rps'], 'req/s', rps)} |",
        f"| one call's round trip, sequential | {_fmt(b['sequential_call_us'], 'µs', ns)} |",
        "",
        "The fake controller (Python, one event loop) runs in a child process; client and "
        "server share the 2 cores, so the server is part of what is measured. Rate "
        "percentiles are over the per-run rates (the JSON also has min/max); the round-trip "
        "row is over every single call of one run.",
        "",
        "What the client adds per call on top of a bare wire client (same fake, same op, "
        "alternating runs; sequential):",
        "",
        "| per call | median | p90 | p99 | unit |",
        "|---|---|---|---|---|",
        f"| client, wall | {_fmt(v['client_wall_us'], 'µs', ns)} |",
        f"| bare wire, wall | {_fmt(v['raw_wall_us'], 'µs', ns)} |",
        f"| client, this process's CPU | {_fmt(v['client_cpu_us'], 'µs', ns)} |",
        f"| bare wire, this process's CPU | {_fmt(v['raw_cpu_us'], 'µs', ns)} |",
        "",
        f"The client adds {b['client_adds_us_median']['wall']:.1f} µs of wall time and "
        f"{b['client_adds_us_median']['cpu']:.1f} µs of CPU per call at the median (failover, "
        "idempotency key, liveness, rejoin checks; CPU is the robust figure on a shared "
        "machine).",
        "",
        "## (c) connect latency: through a redirecting standby vs direct",
        "",
        "| path | median | p90 | p99 | unit |",
        "|---|---|---|---|---|",
        f"| direct to the primary | {_fmt(c['direct_ms'], 'ms', ms)} |",
        f"| standby first, redirect followed | {_fmt(c['via_standby_redirect_ms'], 'ms', ms)} |",
        "",
        f"A redirect costs {c['extra_ms_median']:.2f} ms more at the median (one extra TCP "
        "connect + handshake), and never a back-off sleep.",
        "",
        f"## (d) blocking facade: SyncClient calls/s ({d['calls_per_run']} calls per run)",
        "",
        "| threads | median | p90 | p99 | unit |",
        "|---|---|---|---|---|",
        f"| 1 | {_fmt(d['one_thread_rps'], 'req/s', rps)} |",
        f"| 8 | {_fmt(d['eight_threads_rps'], 'req/s', rps)} |",
        "",
        "Each call hops onto the client's loop once (`call_soon_threadsafe`), runs as a task, "
        "and the thread waits on one future; a role's stop abandons waiting calls at once.",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    ns = parser.parse_args()
    q = ns.quick
    logger.remove()
    logger.add(sys.stderr, level="ERROR")  # redirects WARN by design
    from benchkit import meta

    res: dict[str, Any] = meta()  # date, cores, platform, python, and this very command line
    res["post_call"] = bench_post_call(repeats=5 if q else 31, number=200_000 if q else 1_000_000)
    res["throughput"] = bench_throughput(calls=1_280 if q else 6_400, repeats=3 if q else 11)
    res["redirect"] = bench_redirect(repeats=20 if q else 200)
    res["blocking"] = bench_blocking(calls=1_000 if q else 4_000, repeats=3 if q else 11)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "connection.json").write_text(json.dumps(res, indent=2) + "\n")
    write_markdown(res, RESULTS / "connection.md")
    print((RESULTS / "connection.md").read_text())


if __name__ == "__main__":
    main()
