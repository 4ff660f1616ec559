"""Listings built in slices that give way to writes, and the verified-token cache, against a
real controller and a real ``xce run apiserver`` process: paging while other clients submit
and kill jobs returns every job exactly once; a token used (so cached) is refused once it is
revoked and once it expires."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from test_api_frontdoor import logon, start_api

from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

BEFORE = 3000
"""Jobs in state before the listings start (a page of 1,000 is 10 slices)."""


def _submit_direct(cl: LocalCluster, n: int, inflight: int = 32) -> None:
    """``n`` pipelined submissions of alice's from a direct client (fast: no HTTP; it poses
    as a front end, which names the user each job is for)."""
    from xcecore.client import Client

    _, config = load(cl.config_path)
    cfg = client_config(config, "apiserver@fill")

    async def main() -> None:
        async with Client(cfg, role="apiserver") as client:
            await client.connect()
            todo = iter(range(n))

            async def lane() -> None:
                for i in todo:
                    await client.call("jobsubmit", {"command": "true", "name": f"pre{i}",
                                                         "user": "alice"})

            async with anyio.create_task_group() as tg:
                for _ in range(inflight):
                    tg.start_soon(lane)

    anyio.run(main)


def _listing(http: httpx.Client, hdr: dict[str, str], query: str, paged: bool) -> list[dict[str, Any]]:
    """Every job of ``GET /jobs?query``, following ``next`` (``paged``) or in one stream."""
    if not paged:
        r = http.get(f"/jobs?{query}".rstrip("?"), headers=hdr)
        assert r.status_code == 200, r.text
        env = r.json()
        assert env["count"] == len(env["data"]) and env["next"] is None
        return list(env["data"])
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = http.get(f"/jobs?{query}" + (f"&cursor={cursor}" if cursor else ""), headers=hdr)
        assert r.status_code == 200, r.text
        env = r.json()
        assert env["count"] == len(env["data"])
        out += env["data"]
        cursor = env["next"]
        if cursor is None:
            return out


def test_paging_while_jobs_are_submitted_and_killed_returns_each_job_once(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    _, base = start_api(cl, tmp_path, "web")
    _submit_direct(cl, BEFORE)
    token = logon(base).json()["data"]["token"]
    hdr = {"Authorization": f"Bearer {token}"}
    http = httpx.Client(base_url=base, timeout=30)
    before = _listing(http, hdr, "limit=1000", True)
    assert len(before) == BEFORE
    ids = sorted(j["jobid"] for j in before)
    killed = set(ids[::7])  # killed while the listings run: they leave PEND
    stop = threading.Event()
    posted: list[int] = []
    errors: list[str] = []

    def poster() -> None:
        with httpx.Client(base_url=base, timeout=30) as h:
            while not stop.is_set():
                r = h.post("/jobs", json={"command": "true", "name": "during"}, headers=hdr)
                if r.status_code != 200:
                    errors.append(r.text)
                    return
                posted.append(r.json()["data"]["jobid"])

    def killer() -> None:
        with httpx.Client(base_url=base, timeout=30) as h:
            for jobid in sorted(killed):
                if stop.is_set():
                    return
                r = h.post(f"/jobs/{jobid}/control", json={"action": "kill"}, headers=hdr)
                if r.status_code != 200:
                    errors.append(r.text)
                    return

    threads = [threading.Thread(target=poster) for _ in range(3)] + [threading.Thread(target=killer)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(posted) >= 20 or errors, 60, what="submissions under way")
        for query, paged in (("limit=1000", True), ("limit=300&state=PEND", True), ("", False)):
            at_start = len(posted)
            seen = [j["jobid"] for j in _listing(http, hdr, query, paged)]
            assert len(seen) == len(set(seen)), f"{query or 'unpaged'}: a job listed twice"
            assert seen == sorted(seen), f"{query or 'unpaged'}: not in job id order"
            if "PEND" in query:  # those never killed stayed PEND throughout
                assert set(ids) - killed <= set(seen), "a job that stayed PEND is missing"
            else:
                assert set(ids) <= set(seen), f"{query or 'unpaged'}: a job is missing"
                # what was posted before the listing began is in it too (its push came first)
                assert set(posted[:max(0, at_start - 10)]) <= set(seen)
            assert len(posted) > at_start or errors, "no submission ran during the listing"
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        http.close()
    assert not errors, errors[:3]


def test_a_cached_token_is_refused_once_revoked_or_expired(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    _, base = start_api(cl, tmp_path, "web", "apiserver.token_ttl=8")

    def get(t: str) -> httpx.Response:
        return httpx.get(f"{base}/jobs?limit=1", headers={"Authorization": f"Bearer {t}"}, timeout=10)

    token = logon(base).json()["data"]["token"]
    assert get(token).status_code == 200 and get(token).status_code == 200  # verified, then cached
    r = httpx.post(f"{base}/auth/logout", headers={"Authorization": f"Bearer {token}"}, timeout=15)
    assert r.status_code == 200, r.text
    r = get(token)
    assert r.status_code == 401 and "revoked" in r.json()["msg"], r.text
    other = logon(base).json()["data"]["token"]
    assert get(other).status_code == 200 and get(other).status_code == 200

    def expired() -> bool:
        r = get(other)
        return r.status_code == 401 and "expired" in r.json()["msg"]

    wait_for(expired, 30, what="the cached token refused after its expiry")
    # A forged token (the cached one with its signature changed) is refused, never cached.
    forged = other[:-4] + ("AAAA" if not other.endswith("AAAA") else "BBBB")
    assert get(forged).status_code == 401
