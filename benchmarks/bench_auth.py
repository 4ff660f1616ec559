"""What authentication costs: the ``key`` method (HMAC) against ``munge``, and the two ways
of reaching munged (the ctypes binding of libmunge against the ``munge``/``unmunge``
programs), on a real munged with its own key and on a real controller candidate.

Run from the repository root, as root (munged runs with ``--force``)::

    python benchmarks/bench_auth.py [--runs 2000] [--quick]

Parts (each figure: medians and percentiles of repeated runs, microseconds or milliseconds):

- ``credential``: one credential made and checked in this process -- ``key``: the client's
  MAC plus the server's check; ``munge (libmunge)``: ``munge_encode`` + ``munge_decode``
  through the binding (two round trips to munged); ``munge (programs)``: ``munge -n`` piped
  to ``unmunge`` (two fork+execs), the alternative the binding was chosen over.
- ``handshake``: a whole handshake over TCP to a real controller candidate (primary) of each
  method: connect, hello, answer, the verdict; sequential, and ``--threads`` clients at once
  (handshakes per second; the controller verifies MUNGE credentials on threads).
- ``phases``: where a handshake's time goes (connect + hello, the client's credential step,
  the server's verdict), one client at a time and ``--herd`` clients at the same instant
  (a failover's reconnects): is minting a credential on the reconnect's critical path?
- ``cli``: ``xce jobs`` wall time (a fresh process each run) against each cluster.

Writes ``benchmarks/results/auth.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import US, log, meta, stats, timed, write_result

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth
from xcecore.auth.munge import SUCCESS, Libmunge, MungeAuth, payload_for
from xcecore.testing.cluster import LocalCluster
from xcecore.testing.munge import Munged, shared_dir

PART = "auth"


def per_call_us(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    """Microseconds of each of ``runs`` calls of ``fn`` (after 20 warm-up calls)."""
    return timed(fn, runs, unit=US, warmup=20, digits=1)


def credential(munged: Munged, runs: int) -> dict[str, Any]:
    """One credential made and verified, per method and per way of reaching munged."""
    users = auth.Users()
    key = KeyAuth(b"x" * 32)
    munge = MungeAuth(munged.socket)
    lib = Libmunge(munged.socket)

    def key_once() -> None:
        challenge, hello = auth.server_hello(key)
        auth.authenticate(key, challenge, auth.client_answer(key, "cli@b", hello), users)

    def munge_once() -> None:
        challenge, hello = auth.server_hello(munge)
        auth.authenticate(munge, challenge, auth.client_answer(munge, "cli@b", hello), users)

    def encode_only() -> None:
        err, _ = lib.encode(payload_for("c" * 32, "cli@b"))
        assert err == SUCCESS

    def programs_once() -> None:
        cred = subprocess.run(["munge", "-S", munged.socket, "-s", payload_for("c" * 32, "cli@b").decode()],
                              capture_output=True, check=True).stdout
        subprocess.run(["unmunge", "-S", munged.socket], input=cred, capture_output=True, check=True)

    return {
        "key (HMAC-SHA256), answer + verify": per_call_us(key_once, runs),
        "munge (libmunge), answer + verify": per_call_us(munge_once, runs),
        "munge (libmunge), munge_encode only": per_call_us(encode_only, runs),
        "munge (programs), munge then unmunge": per_call_us(programs_once, max(20, runs // 20)),
    }


def one_handshake(port: int, method: auth.AuthMethod) -> None:
    """Connect, read the hello, answer, read the verdict (which must be ok)."""
    timed_handshake(port, method)


PHASES = ("connect + hello", "client credential (answer)", "server verdict (verify)", "whole")


def timed_handshake(port: int, method: auth.AuthMethod) -> tuple[float, float, float, float]:
    """One handshake, in its phases (ms): connect until the hello is in; the client's
    credential step (``client_answer``: for munge, a round trip to munged); the answer's send
    until the verdict is in (the server's verify: for munge, its decode at munged, on one of
    its auth threads); the whole."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        dec = wire.FrameDecoder()

        def read() -> dict[str, Any]:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                for msg in dec.feed(chunk):
                    return dict(msg)

        hello = read()
        t1 = time.perf_counter()
        answer = auth.client_answer(method, "bench@b", hello)
        t2 = time.perf_counter()
        s.sendall(wire.encode(answer))
        verdict = read()
        t3 = time.perf_counter()
        if not verdict.get("ok"):
            raise RuntimeError(f"handshake refused: {verdict}")
    return ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3)


def phases(clusters: dict[str, LocalCluster], runs: int, herd: int) -> dict[str, Any]:
    """Where a (re)connect's handshake time goes, per method and phase (ms), with ``herd``
    clients handshaking at the same instant (a failover: the writer and every role reconnect
    at once). The methods take turns round by round, so they share the machine's load alike."""
    targets = {name: (c.method(), c.ports[c.wait_primary()]) for name, c in clusters.items()}
    got: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in targets}
    errors: list[BaseException] = []
    for _ in range(max(1, runs // herd)):
        for name, (method, port) in targets.items():
            gate = threading.Barrier(herd)

            def one(name: str = name, method: auth.AuthMethod = method, port: int = port,
                    gate: threading.Barrier = gate) -> None:
                try:
                    gate.wait(10)
                    got[name].append(timed_handshake(port, method))
                except BaseException as exc:  # reported below
                    errors.append(exc)

            pool = [threading.Thread(target=one) for _ in range(herd)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
    if errors:
        raise errors[0]
    return {f"{name}, {herd} at once": {ph: stats([g[i] for g in rows], 3) for i, ph in enumerate(PHASES)}
            for name, rows in got.items()}


def handshakes(cluster: LocalCluster, runs: int, threads: int) -> dict[str, Any]:
    """Sequential handshake latency (ms) and handshakes/s with ``threads`` clients at once."""
    method, port = cluster.method(), cluster.ports[cluster.wait_primary()]
    seq = per_call_us(lambda: one_handshake(port, method), runs)
    each = max(50, runs // threads)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(each):
                one_handshake(port, method)
        except BaseException as exc:  # reported below
            errors.append(exc)

    rates = []
    for _ in range(3):
        pool = [threading.Thread(target=client) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        rates.append(threads * each / (time.perf_counter() - t0))
    if errors:
        raise errors[0]
    return {"sequential_ms": {k: (v / 1000 if k != "n" else v) for k, v in seq.items()},
            f"concurrent_{threads}_threads_per_s": stats(rates, 0)}


def cli_jobs(cluster: LocalCluster, runs: int) -> dict[str, float]:
    """Wall ms of ``xce jobs`` (a fresh process each run; one warm-up)."""
    xce = shutil.which("xce") or str(Path(sys.executable).parent / "xce")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XCE_CONFIG"] = str(cluster.config_path)
    return timed(lambda: subprocess.run([xce, "jobs"], env=env, capture_output=True, check=True),
                 runs, warmup=1, digits=1)


def main(argv: list[str] | None = None) -> int:
    """Run every part and write benchmarks/results/auth.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="credentials / handshakes per figure")
    ap.add_argument("--cli-runs", type=int, default=30, help="xce jobs runs per cluster")
    ap.add_argument("--threads", type=int, default=8, help="concurrent handshaking clients")
    ap.add_argument("--herd", type=int, default=5,
                    help="clients handshaking at one instant in the phases part (a failover's "
                         "writer and four roles: 5)")
    ap.add_argument("--quick", action="store_true", help="200 runs, 10 CLI runs")
    args = ap.parse_args(argv)
    runs, cli_runs = (200, 10) if args.quick else (args.runs, args.cli_runs)
    root = shared_dir("xce-bench-auth-")
    munged = Munged(root / "munge")
    clusters: dict[str, LocalCluster] = {}
    result: dict[str, Any] = {**meta(), "runs": runs, "threads": args.threads,
                              "loadavg_1min_at_start": round(os.getloadavg()[0], 2)}
    try:
        munged.start()
        log(PART, f"munged up at {munged.socket}; {runs} runs per figure")
        result["credential_us"] = credential(munged, runs)
        clusters["key"] = LocalCluster(root / "key", 1)
        clusters["munge"] = LocalCluster(root / "munge-cluster", 1, None, auth="munge",
                                         munge_socket=munged.socket)
        for c in clusters.values():
            c.start(60)
        result["handshake"] = {name: handshakes(c, runs, args.threads) for name, c in clusters.items()}
        result["phases_ms"] = {**phases(clusters, max(200, runs // 2), 1),
                               **phases(clusters, max(200, runs // 2), args.herd)}
        result["cli_xce_jobs_ms"] = {name: cli_jobs(c, cli_runs) for name, c in clusters.items()}
    finally:
        for c in clusters.values():
            c.close()
        munged.stop()
        shutil.rmtree(root, ignore_errors=True)
    result["loadavg_1min_at_end"] = round(os.getloadavg()[0], 2)
    write_result(PART, result)
    for name, s in result["credential_us"].items():
        log(PART, f"credential {name}: p50 {s['p50']} us p99 {s['p99']} us")
    for name, h in result["handshake"].items():
        seq = h["sequential_ms"]
        rate = h[f"concurrent_{args.threads}_threads_per_s"]
        log(PART, f"handshake {name}: p50 {seq['p50']:.3f} ms p99 {seq['p99']:.3f} ms; "
                  f"{rate['p50']:.0f}/s with {args.threads} clients")
    for name, ph in result["phases_ms"].items():
        log(PART, f"phases {name}: " + "; ".join(f"{k} p50 {v['p50']:.3f} p90 {v['p90']:.3f}"
                                                  for k, v in ph.items()))
    for name, s in result["cli_xce_jobs_ms"].items():
        log(PART, f"xce jobs ({name}): p50 {s['p50']} ms p90 {s['p90']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
