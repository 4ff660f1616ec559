"""What token revocation costs: the check every request makes, and a logout's latency.

Run from the repository root::

    python benchmarks/bench_revoke.py [--runs 200] [--checks 20000] [--quick]

Parts (medians and percentiles of repeated runs):

- ``check``: in this process, :meth:`Authenticator.check` of a live token (signature, claims,
  then the revocation list) with an empty list and with ``--listed`` records (half of them
  tokens of the same user, half user-wide), and the list's lookup alone, microseconds;
- ``rest``: two API server processes with a shared token key on a one-candidate cluster (real
  processes, loopback): ``POST /auth/logout`` (answered once the controller committed the
  revocation), the time from its answer until the other API server refuses the token (each
  probe is one ``GET /jobs?limit=1``, so the figure is at most one probe late), and
  ``GET /jobs?limit=1`` with a live token before and after ``--runs`` logouts (what the check
  costs a request when the list is long), milliseconds.

Writes ``benchmarks/results/revoke.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import (
    BENCH_PASSWORD,
    BENCH_USER,
    US,
    cluster_extra,
    log,
    meta,
    stats,
    timed,
    write_result,
)

PART = "revoke"


def per_call_us(fn: Any, runs: int) -> dict[str, float]:
    """Microseconds per call of ``fn``, each of ``runs`` timed alone (after a warm-up)."""
    return timed(fn, runs, unit=US, warmup=200)


def check_part(checks: int, listed: int) -> dict[str, Any]:
    from xce_apiserver.auth import Authenticator, hash_password, parse_users

    users = parse_users([{"name": "alice", "password_hash": hash_password("x", iterations=1000)}])
    auth = Authenticator(users, key=b"k" * 32)
    session = auth.issue(users["alice"])
    empty = per_call_us(lambda: auth.check(session.token), checks)
    lookup_empty = per_call_us(lambda: auth.revocations.why(session.jti, "alice", session.issued), checks)
    for i in range(listed):
        if i % 2:
            auth.revocations.hold({"key": f"t:tok{i:08d}", "user": "alice", "jti": f"tok{i:08d}",
                                   "expires": time.time() + 3600, "rev": i})
        else:
            auth.revocations.hold({"key": f"u:user{i}", "user": f"user{i}", "before": time.time(),
                                   "expires": time.time() + 3600, "rev": i})
    full = per_call_us(lambda: auth.check(session.token), checks)
    lookup_full = per_call_us(lambda: auth.revocations.why(session.jti, "alice", session.issued), checks)
    assert isinstance(auth.check(session.token), type(session))
    return {"listed": listed, "check_empty_us": empty, "check_listed_us": full,
            "lookup_empty_us": lookup_empty, "lookup_listed_us": lookup_full}


def rest_part(runs: int) -> dict[str, Any]:
    import httpx
    from xce_apiserver.auth import write_token_key

    from xcecore.testing.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="xce-bench-revoke-") as tmp:
        root = Path(tmp)
        key = root / "token.key"
        write_token_key(str(key))
        cl = LocalCluster(root / "cluster", 1, extra_config=cluster_extra(root, api=True, hash_iterations=1000))
        try:
            cl.start(60)
            bases = [cl.start_apiserver(root / f"{name}.port", f'apiserver.token_key_file="{key}"',
                                        f'apiserver.hname="{name}"', name=name, timeout=60)[1]
                     + "/xce/v1" for name in ("web1", "web2")]
            one, two = (httpx.Client(base_url=b, timeout=10) for b in bases)

            def logon() -> str:
                r = one.post("/auth/logon", json={"username": BENCH_USER, "password": BENCH_PASSWORD})
                r.raise_for_status()
                return str(r.json()["data"]["token"])

            live = logon()
            hdr = {"Authorization": f"Bearer {live}"}

            def get_ms(n: int) -> dict[str, float]:
                def get() -> None:
                    assert one.get("/jobs", params={"limit": 1}, headers=hdr).status_code == 200

                return timed(get, n)

            get_before = get_ms(runs)
            logout, seen = [], []
            for _ in range(runs):
                token = logon()
                auth = {"Authorization": f"Bearer {token}"}
                t0 = time.perf_counter()
                r = one.post("/auth/logout", headers=auth)
                t1 = time.perf_counter()
                assert r.status_code == 200, r.text
                while two.get("/jobs", params={"limit": 1}, headers=auth).status_code != 401:
                    if time.perf_counter() - t1 > 10:
                        raise TimeoutError("the other API server never refused the token")
                logout.append((t1 - t0) * 1e3)
                seen.append((time.perf_counter() - t1) * 1e3)
            get_after = get_ms(runs)
            return {"runs": runs, "logout_ms": stats(logout), "refused_elsewhere_ms": stats(seen),
                    "get_before_ms": get_before, "get_after_ms": get_after, "listed_after": runs}
        finally:
            cl.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="logouts (and GETs before and after)")
    ap.add_argument("--checks", type=int, default=20000, help="token checks timed per case")
    ap.add_argument("--listed", type=int, default=100_000, help="records in the long list")
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.checks, args.listed = 20, 2000, 10_000
    t0 = time.time()
    load0 = _loadavg()
    log(PART, f"check: {args.checks} checks, empty list and {args.listed} records")
    check = check_part(args.checks, args.listed)
    log(PART, f"rest: {args.runs} logouts through two API servers")
    rest = rest_part(args.runs)
    write_result(PART, {**meta(), "loadavg_1min_at_start": load0, "loadavg_1min_at_end": _loadavg(),
                        "seconds": round(time.time() - t0, 1), "check": check, "rest": rest})
    return 0


def _loadavg() -> float:
    import os

    return round(os.getloadavg()[0], 2)


if __name__ == "__main__":
    raise SystemExit(main())
