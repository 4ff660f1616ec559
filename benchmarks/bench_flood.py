"""Flood benchmark: the controller's memory under clients that never read what it sends.

Run from the repository root::

    python benchmarks/bench_flood.py [--quick] [--repeat N] [--jobs N]

A real controller process (``python -m xce_controller``) holds ``--jobs`` jobs of ~2 KB each,
so one ``jobinfo`` reply is a few MB. For each scenario, ``--clients`` connections flood it and
never read a byte of what comes back:

- ``jobinfo``: each sends thousands of ``jobinfo`` requests (issue 15: 3.4 GB after ~720);
- ``join``: each joins as an API server again and again (every join answers with the full
  state, a push of a few MB);
- ``deaf members``: each joins as a scheduler, then never reads its pushes, while a worker
  sends resource values of ~64 KB (a push of that size to every member each time; volatile,
  so the state does not grow and the RSS shows the connections).

Meanwhile a well-behaved client calls ``hello`` and ``jobinfo`` (limit 3) in a loop: its
latencies and failures show whether everyone else is served. The controller's RSS is sampled
every 50 ms (psutil). Each scenario runs twice: with the default bounds (``max_unsent_bytes``
32 MiB, ``max_inflight`` 4096, ``stall_timeout`` 30 s), and with only the count bounds the
controller had before (the byte bound and the stall timeout made too large to act), killed
when its RSS passes ``--rss-cap`` MB so the machine survives it (the peak is then a little
over the cap: it is sampled every 50 ms). Writes ``benchmarks/results/flood.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import ROOT, log, meta, stats, write_result

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth

PART = "flood"
KEY = b"bench-flood-key"
MB = 1024 * 1024
# What the controller had before: only the count bounds (max_inflight 4096 replies,
# max_subscriber_queue 10,000 pushes), no byte bound, no stall timeout.
UNBOUNDED = ["--max-unsent-bytes", str(1 << 50), "--stall-timeout", "1e9"]


class Conn:
    """A handshaken blocking connection (xcecore.wire + xcecore.auth only)."""

    def __init__(self, address: str, identity: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.dec = wire.FrameDecoder(64 * MB)
        self.msgs: list[dict[str, Any]] = []
        hello = self.recv()
        self.sock.sendall(wire.encode(auth.client_answer(KeyAuth(KEY), identity, hello)))
        self.status = self.recv()
        self.n = 0

    def recv(self) -> dict[str, Any]:
        while not self.msgs:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the controller")
            self.msgs.extend(self.dec.feed(data))
        return self.msgs.pop(0)

    def call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        self.n += 1
        self.sock.sendall(wire.encode(wire.request(self.n, op, args)))
        while True:
            msg = self.recv()
            if msg.get("id") == self.n:
                return msg

    def close(self) -> None:
        self.sock.close()


class Controller:
    """A controller candidate process on a free port, killed by pid."""

    def __init__(self, root: Path, extra: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        (root / "key").write_bytes(KEY)
        self.log = root / "controller.log"
        cmd = [sys.executable, "-m", "xce_controller", "--listen", self.address, "--state-dir",
               str(root / "state"), "--key-file", str(root / "key"), "--admins", "root",
               "--log-level", "WARNING", *extra]
        with open(self.log, "wb") as fh:
            self.popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 30
        while True:
            try:
                c = Conn(self.address, "cli@probe")
                if c.status.get("state") == "primary":
                    c.close()
                    break
                c.close()
            except (OSError, ConnectionError):
                pass
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"controller did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def rss(self) -> int:
        import psutil

        return int(psutil.Process(self.popen.pid).memory_info().rss)

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)


def flood(address: str, identity: str, frames: bytes, stop: threading.Event,
          socks: list[socket.socket]) -> None:
    """Send ``frames``, never read; give up sending when the controller stops taking them."""
    try:
        c = Conn(address, identity)
    except (OSError, ConnectionError):
        return  # the controller is too busy to take one more connection (bounds off)
    if identity.startswith("scheduler@"):
        assert c.call("join", {"role": "scheduler"})["ok"]
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.sock.settimeout(0.2)
    socks.append(c.sock)  # kept open until the end: a stalled peer, not a dead one
    view = memoryview(frames)
    while view and not stop.is_set():
        try:
            view = view[c.sock.send(view[: 1 << 16]):]
        except TimeoutError:
            continue
        except OSError:
            return  # dropped by the controller


def scenario(name: str, bounded: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One run of one scenario: the controller's RSS and the well-behaved client's latencies."""
    with tempfile.TemporaryDirectory(prefix="xce-flood-") as tmp:
        ctl = Controller(Path(tmp), [] if bounded else UNBOUNDED)
        stop = threading.Event()
        socks: list[socket.socket] = []
        threads: list[threading.Thread] = []
        try:
            admin = Conn(ctl.address, "cli@fill")
            admin.sock.settimeout(60)
            command = "x" * 2000
            # 64 KB of resource values per update, in strings of the longest length a value
            # may have (xcecore.schema.limits.RESVAL_STRING_MAX).
            big = {f"blob{k}": "y" * 1000 for k in range(64)}
            # The pushes to the deaf members: a worker's resource values (a volatile update, so
            # the state does not grow with them and the RSS shows the connections only).
            pusher = Conn(ctl.address, "worker@pusher")
            assert pusher.call("join", {"role": "worker", "attrs": {"hname": "pusher", "ncpus": 1}})["ok"]
            for i in range(args.jobs):
                assert admin.call("jobsubmit", {"command": command, "name": str(i)})["ok"]
            reply_bytes = len(wire.encode(admin.call("jobinfo")))
            base = ctl.rss()
            if name == "jobinfo":
                frames = b"".join(wire.encode(wire.request(i, "jobinfo", {})) for i in range(1, 20001))
            elif name == "join":
                frames = b"".join(wire.encode(wire.request(i, "join", {"role": "apiserver"}))
                                  for i in range(1, 20001))
            else:
                frames = b""
            role = {"jobinfo": "cli", "join": "apiserver", "deaf members": "scheduler"}[name]
            for k in range(args.clients):
                t = threading.Thread(target=flood, args=(ctl.address, f"{role}@flood{k}", frames, stop, socks),
                                     daemon=True)
                t.start()
                threads.append(t)
            samples: list[int] = []
            capped = threading.Event()

            def sample() -> None:  # independent of the well-behaved client, which may hang
                while not stop.is_set() and ctl.popen.poll() is None:
                    try:
                        samples.append(ctl.rss())
                    except Exception:  # gone meanwhile
                        return
                    if samples[-1] > args.rss_cap * MB:
                        capped.set()
                        ctl.kill()  # before it takes the machine with it
                        return
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            threads.append(sampler)
            lat: list[float] = []
            failures = 0
            t0 = time.monotonic()
            good: Conn | None = None
            while time.monotonic() - t0 < args.seconds and not capped.is_set():
                if name == "deaf members":  # ~1.3 MB of pushes to every member per round
                    for i in range(20):
                        reply = pusher.call("update_resvals", {"values": {**big, "n": i}})
                        assert reply["ok"], reply
                s = time.perf_counter()
                try:
                    if good is None:
                        good = Conn(ctl.address, "cli@good")
                        good.sock.settimeout(5)
                    ok = good.call("hello")["ok"] and len(good.call("jobinfo", {"limit": 3})["result"]["jobs"]) == 3
                except (OSError, ConnectionError):  # a timeout (5 s) included
                    ok, good = False, None
                lat.append((time.perf_counter() - s) * 1000)
                failures += not ok
                time.sleep(0.05)
            stop.set()
            sampler.join(5)
            text = ctl.log.read_text()
            return {
                "bounded": bounded, "jobs": args.jobs, "clients": args.clients,
                "jobinfo_reply_mb": round(reply_bytes / MB, 2),
                "rss_base_mb": round(base / MB, 1), "rss_peak_mb": round(max(samples) / MB, 1),
                "rss_last_mb": round(samples[-1] / MB, 1),
                "rss_growth_mb": round((max(samples) - base) / MB, 1),
                "stopped_at_rss_cap": capped.is_set(), "seconds": round(time.monotonic() - t0, 1),
                "other_client_ms": stats(lat, 2), "other_client_failures": failures,
                "held_back_logged": text.count("is not reading its replies"),
                "dropped_logged": text.count("is over its bound") + text.count("took no data"),
                "controller_alive": capped.is_set() or ctl.popen.poll() is None,
            }
        finally:
            stop.set()
            for t in threads:
                t.join(5)
            for s in socks:
                s.close()
            ctl.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repeat, fewer jobs, shorter runs")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each scenario and mode")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs in the state (~2 KB each)")
    ap.add_argument("--clients", type=int, default=4, help="flooding connections per scenario")
    ap.add_argument("--seconds", type=float, default=10.0, help="flood duration per run")
    ap.add_argument("--rss-cap", type=float, default=1000.0,
                    help="MB of controller RSS at which an unbounded run is stopped")
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.jobs, args.seconds = 1, 500, 5.0
    out: dict[str, Any] = {"meta": meta(), "scenarios": {}}
    for name in ("jobinfo", "join", "deaf members"):
        for bounded in (True, False):
            runs = []
            for r in range(args.repeat):
                res = scenario(name, bounded, args)
                log(PART, f"{name}, {'bounded' if bounded else 'bounds off'}, run {r + 1}: RSS "
                          f"{res['rss_base_mb']} -> peak {res['rss_peak_mb']} MB"
                          f"{' (stopped at the cap)' if res['stopped_at_rss_cap'] else ''}; other "
                          f"client p50 {res['other_client_ms'].get('p50')} ms, "
                          f"{res['other_client_failures']} failures")
                runs.append(res)
            key = f"{name} ({'bounded' if bounded else 'bounds off'})"
            out["scenarios"][key] = {
                "runs": runs,
                "rss_peak_mb": stats([r["rss_peak_mb"] for r in runs], 1),
                "rss_growth_mb": stats([r["rss_growth_mb"] for r in runs], 1),
                "other_client_p50_ms": stats([r["other_client_ms"]["p50"] for r in runs], 2),
                "other_client_p99_ms": stats([r["other_client_ms"]["p99"] for r in runs], 2),
                "other_client_failures": sum(r["other_client_failures"] for r in runs),
                "stopped_at_rss_cap": sum(r["stopped_at_rss_cap"] for r in runs),
            }
    write_result(PART, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
