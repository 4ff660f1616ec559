"""Controller benchmark: durable submissions/s, promotion after SIGKILL, full-state push.

    /work/venv/bin/python benchmarks/bench_controller.py [--quick]

Runs real controller processes (``python -m xce_controller``) on 127.0.0.1 with a state dir in
a temporary directory, and a raw client built on xcecore.wire + xcecore.auth. Every submit is
acknowledged only after its SQLite commit (WAL, synchronous=FULL). Writes
benchmarks/results/controller.json and controller.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.streams.buffered import BufferedByteReceiveStream

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth
from xcecore.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
KEY = b"bench-key"


class Client:
    """A raw pipelining client."""

    def __init__(self, stream: Any, reader: BufferedByteReceiveStream, hello: dict[str, Any]) -> None:
        self.stream, self.reader, self.hello = stream, reader, hello
        self.ids = itertools.count(1)

    @classmethod
    async def connect(cls, address: str, identity: str = "cli@bench") -> Client:
        host, _, port = address.rpartition(":")
        stream = await anyio.connect_tcp(host, int(port))
        reader = BufferedByteReceiveStream(stream)
        hello = await wire.read_message(reader)
        await wire.write_message(stream, auth.client_answer(KeyAuth(KEY), identity, hello))
        return cls(stream, reader, await wire.read_message(reader))

    async def call(self, op: str, args: dict[str, Any], rid: str | None = None) -> dict[str, Any]:
        n = next(self.ids)
        await wire.write_message(self.stream, wire.request(n, op, args, rid))
        while True:
            msg = await wire.read_message(self.reader, 1 << 30)
            if msg.get("id") == n:
                return msg

    async def pipeline(self, frames: list[bytes], window: int = 2000) -> int:
        """Send ``frames`` (requests) with at most ``window`` unanswered; return ok replies."""
        ok = 0
        sem = anyio.Semaphore(window)
        done = anyio.Event()
        total = len(frames)

        async def reader() -> None:
            nonlocal ok
            got = 0
            while got < total:
                msg = await wire.read_message(self.reader, 1 << 30)
                if "push" in msg:
                    continue
                got += 1
                ok += bool(msg.get("ok"))
                sem.release()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            batch: list[bytes] = []
            for f in frames:
                await sem.acquire()
                batch.append(f)
                if len(batch) >= 200 or sem.value == 0:
                    await self.stream.send(b"".join(batch))
                    batch = []
            if batch:
                await self.stream.send(b"".join(batch))
            await done.wait()
        return ok

    async def aclose(self) -> None:
        await self.stream.aclose()


def submit_frames(n: int, tag: str) -> list[bytes]:
    return [
        wire.encode(wire.request(i + 1, "jobsubmit", {"command": "sleep 1"}, f"{tag}-{i}"))
        for i in range(n)
    ]


def start(state_dir: Path, log_dir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = log_dir / f"ctl-{port}.log"
    keyfile = log_dir / "key"
    keyfile.write_bytes(KEY)
    with open(log, "wb") as fh:
        p = subprocess.Popen(
            [sys.executable, "-m", "xce_controller", "--listen", addr, "--state-dir", str(state_dir),
             "--key-file", str(keyfile), "--admins", "bench", "--log-level", "INFO"],
            stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    return p, addr, log


async def wait_primary(addrs: list[str], timeout: float = 20) -> str:
    with anyio.fail_after(timeout):
        while True:
            for a in addrs:
                try:
                    c = await Client.connect(a)
                    await c.aclose()
                    if c.hello.get("state") == "primary":
                        return a
                except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    pass
            await anyio.sleep(0.005)


async def wait_standby(addr: str, log: Path, timeout: float = 30) -> float:
    """Wait until the candidate at ``addr`` stands by, ready to take over: it answers as a
    standby and, if it is a hot standby (it logs that it follows the primary's commits), has
    loaded its copy of the state. Returns the seconds waited.

    A kill before that measures the new candidate's interpreter start and a cold load, not a
    failover to a standby: ``python -m xce_controller`` needs 0.3-0.5 s of CPU to import here,
    more than the trial's warm-up gave it (its figure was then the start, 200 ms and more).
    """
    t0 = time.perf_counter()
    with anyio.fail_after(timeout):
        while True:
            try:
                c = await Client.connect(addr)
                await c.aclose()
                if c.hello.get("state") == "standby":
                    text = log.read_text()
                    if "following" not in text or "standby: loaded" in text:
                        return time.perf_counter() - t0
            except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                pass
            await anyio.sleep(0.01)


def kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(5)


async def bench_throughput(tmp: Path, n_seq: int, n_pipe: int, n_multi: int) -> dict[str, Any]:
    p, addr, _ = start(tmp / "tput", tmp)
    try:
        await wait_primary([addr])
        c = await Client.connect(addr)
        for i in range(200):  # warm-up
            await c.call("jobsubmit", {"command": "w"}, f"warm-{i}")
        t0 = time.perf_counter()
        for i in range(n_seq):
            r = await c.call("jobsubmit", {"command": "sleep 1"}, f"seq-{i}")
            assert r["ok"], r
        seq = n_seq / (time.perf_counter() - t0)
        frames = submit_frames(n_pipe, "pipe")
        t0 = time.perf_counter()
        ok = await c.pipeline(frames)
        pipe = ok / (time.perf_counter() - t0)
        assert ok == n_pipe
        await c.aclose()
        clients = [await Client.connect(addr) for _ in range(8)]
        per = n_multi // 8
        framesets = [submit_frames(per, f"m{k}") for k in range(8)]
        counts: list[int] = []

        async def run(cl: Client, fr: list[bytes]) -> None:
            counts.append(await cl.pipeline(fr, window=500))

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for cl, fr in zip(clients, framesets, strict=True):
                tg.start_soon(run, cl, fr)
        multi = sum(counts) / (time.perf_counter() - t0)
        for cl in clients:
            await cl.aclose()
        return {"sequential_per_s": round(seq), "pipelined_1_client_per_s": round(pipe),
                "pipelined_8_clients_per_s": round(multi),
                "counts": {"sequential": n_seq, "pipelined": n_pipe, "pipelined_8": n_multi}}
    finally:
        kill(p)


async def bench_promotion(tmp: Path, trials: int) -> dict[str, Any]:
    """Kill the primary while a client writes; time to the first write acked by the new one."""
    state = tmp / "ha"
    procs = [start(state, tmp)]
    await wait_primary([procs[0][1]])
    procs.append(start(state, tmp))
    client_ms: list[float] = []
    internal_ms: list[float] = []
    ready_s: list[float] = []  # how long each trial waited for its standby to be ready
    try:
        for t in range(trials):
            addrs = [a for _, a, _ in procs]
            primary = await wait_primary(addrs)
            standby = next(x for x in procs if x[1] != primary)
            ready_s.append(await wait_standby(standby[1], standby[2]))
            await anyio.sleep(0.3)  # the standby is up and waiting on the lock
            c = await Client.connect(primary)
            for i in range(50):
                await c.call("jobsubmit", {"command": "x"}, f"t{t}-{i}")
            await c.aclose()
            victim = next(x for x in procs if x[1] == primary)
            other = next(x for x in procs if x[1] != primary)
            t0 = time.perf_counter()
            os.kill(victim[0].pid, signal.SIGKILL)
            with anyio.fail_after(20):
                while True:
                    try:
                        c = await Client.connect(other[1])
                        if c.hello.get("state") == "primary":
                            r = await c.call("jobsubmit", {"command": "after"}, f"after-{t}")
                            await c.aclose()
                            if r["ok"]:
                                break
                        else:
                            await c.aclose()
                    except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                        pass
                    await anyio.sleep(0.001)
            client_ms.append((time.perf_counter() - t0) * 1000)
            victim[0].wait(5)
            found = re.findall(r"promoted to primary .* in ([0-9.]+) ms", other[2].read_text())
            if found:
                internal_ms.append(float(found[-1]))
            procs.remove(victim)
            procs.append(start(state, tmp))
    finally:
        for p, _, _ in procs:
            kill(p)

    def summary(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"n": len(xs), "min": round(xs[0], 1), "median": round(statistics.median(xs), 1),
                "p90": round(xs[int(0.9 * (len(xs) - 1))], 1), "max": round(xs[-1], 1)}

    return {"kill_to_first_acked_write_ms": summary(client_ms), "promote_internal_ms": summary(internal_ms),
            "standby_ready_wait_s": [round(x, 2) for x in ready_s]}


async def bench_full_state(tmp: Path, n_jobs: int, n_hosts: int, reps: int) -> dict[str, Any]:
    p, addr, _ = start(tmp / "fs", tmp)
    try:
        await wait_primary([addr])
        for h in range(n_hosts):
            w = await Client.connect(addr, f"worker@h{h:04d}")
            await w.call("join", {"role": "worker", "attrs": {"hname": f"h{h:04d}", "ncpus": 8}})
            await w.aclose()
        c = await Client.connect(addr)
        assert await c.pipeline(submit_frames(n_jobs, "fs")) == n_jobs
        await c.aclose()
        times: list[float] = []
        size = frames = 0
        for _ in range(reps):
            s = await Client.connect(addr, "scheduler@bench")
            t0 = time.perf_counter()
            await wire.write_message(s.stream, wire.request(1, "join", {"role": "scheduler"}))
            held: dict[str, int] = {}
            size = frames = 0
            while True:  # the streamed sync: sync_begin, sync_records frames, sync_end
                msg = await wire.read_message(s.reader, 1 << 30)
                if msg.get("push") == "sync_records":
                    held[msg["data"]["kind"]] = held.get(msg["data"]["kind"], 0) + len(msg["data"]["items"])
                if "push" in msg and msg["push"].startswith("sync_"):
                    size, frames = size + len(orjson.dumps(msg)), frames + 1
                if msg.get("push") == "sync_end":
                    break
            times.append((time.perf_counter() - t0) * 1000)
            assert held.get("jobs") == n_jobs and held.get("hosts") == n_hosts, held
            await s.aclose()
        return {"jobs": n_jobs, "hosts": n_hosts, "bytes": size, "frames": frames,
                "join_to_state_received_ms": {"median": round(statistics.median(times), 1),
                                              "min": round(min(times), 1), "max": round(max(times), 1)}}
    finally:
        kill(p)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xce-bench-") as d:
        tmp = Path(d)
        q = args.quick
        tput = await bench_throughput(tmp, 500 if q else 3000, 5000 if q else 30000, 8000 if q else 40000)
        promo = await bench_promotion(tmp, 3 if q else 12)
        fs = await bench_full_state(tmp, 10000, 1000, 2 if q else 5)
    return {"throughput": tput, "promotion": promo, "full_state": fs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update results")
    args = ap.parse_args()
    results = anyio.run(main_async, args)
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
        "command": "python benchmarks/bench_controller.py" + (" --quick" if args.quick else ""),
    }
    out = {"meta": meta, **results}
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    if args.no_write:
        return
    res = ROOT / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "controller.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    t, p, f = results["throughput"], results["promotion"], results["full_state"]
    k, i = p["kill_to_first_acked_write_ms"], p["promote_internal_ms"]
    st = f["join_to_state_received_ms"]
    rows = [
        ("durable submits/s, sequential, 1 client", t["sequential_per_s"], ">= 1,000"),
        ("durable submits/s, pipelined, 1 client", t["pipelined_1_client_per_s"], ">= 10,000"),
        ("durable submits/s, pipelined, 8 clients", t["pipelined_8_clients_per_s"], ">= 10,000"),
        (f"SIGKILL of primary -> first acked write on the standby (ms, n={k['n']})",
         f"median {k['median']}, p90 {k['p90']}, min {k['min']}, max {k['max']}", "median <= 100"),
        ("promotion inside the standby: lock -> serving (ms)",
         f"median {i['median']}, p90 {i['p90']}, max {i['max']}", "milliseconds"),
        (f"state sync, {f['jobs']} jobs + {f['hosts']} hosts ({f['bytes'] / 1e6:.1f} MB in "
         f"{f['frames']} frames): join -> sync_end received (ms)", f"median {st['median']}, max {st['max']}", ""),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    md = (
        f"# Controller benchmark\n\nMeasured {meta['date']} on {meta['cores']} cores, Python "
        f"{meta['python']}, loopback only.\nCommand: `{meta['command']}`. Every submit is acknowledged "
        "after its SQLite commit\n(WAL, synchronous=FULL, group commit); clients are raw wire clients "
        "in a separate process.\n\n| measure | xce | aim |\n|---|---|---|\n" + table + "\n"
    )
    (res / "controller.md").write_text(md)


if __name__ == "__main__":
    main()
