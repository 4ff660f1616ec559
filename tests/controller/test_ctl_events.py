"""Cluster events: recorded by the primary, stored, kept for a window, paged by seq.

Real controllers (a subprocess per candidate for the failover; in-process candidates on real
TCP and real SQLite for the rest), real SIGKILL.
"""

from __future__ import annotations

import sqlite3
import time

import anyio
import pytest
from ctl_testlib import RawClient, controllers, find_primary, running, wait_listening
from xce_controller.events import PAGE_MAX, EventLog

pytestmark = pytest.mark.anyio
HOST_ATTRS = {"hname": "n1", "ncpus": 2}


async def _events(c: RawClient, **args: object) -> dict:
    return await c.ok("events", dict(args))  # type: ignore[no-any-return]


async def _wait_event(c: RawClient, timeout: float = 10, **match: object) -> dict:
    """Poll the events op until one matches every ``match`` field (bounded: a hang fails)."""
    seen: list[dict] = []
    with anyio.fail_after(timeout):
        cursor = 0
        while True:
            msg = await c.call("events", {"since_seq": cursor, "limit": PAGE_MAX})
            if not msg["ok"]:  # a new primary answers UNAVAILABLE while it reads its events
                assert msg["error"]["code"] == "UNAVAILABLE", msg
                await anyio.sleep(0.02)
                continue
            page = msg["result"]
            seen.extend(page["events"])
            cursor = page["next"]
            for ev in seen:
                if all(ev.get(k) == v for k, v in match.items()):
                    return ev
            await anyio.sleep(0.02)


async def test_failover_records_promotion_and_keeps_earlier_events(tmp_path):
    state_dir, logs = tmp_path / "state", tmp_path / "logs"
    logs.mkdir()
    with controllers(state_dir, logs, 2) as procs:
        addresses = [p.address for p in procs]
        for a in addresses:
            wait_listening(a)
        first = await find_primary(addresses)
        c = await RawClient.connect(first)
        promo = await _wait_event(c, kind="promotion", primary=first)
        assert promo["how"] in ("hot", "cold") and isinstance(promo["takeover_ms"], float)
        await c.ok("queuectrl", {"queue": "normal", "action": "close", "user": "root"})
        closed = await _wait_event(c, kind="queue_state", queue="normal", state="closed")
        assert "root" in closed["by"] and closed["text"].startswith("queue normal closed by root")
        before = (await _events(c, limit=PAGE_MAX))["events"]
        await c.aclose()
        # The standby has followed the primary's commits: the SIGKILLed primary's events are
        # in the store it promotes on.
        procs[0].kill()
        new = await find_primary(addresses[1:])
        c2 = await RawClient.connect(new)
        promo2 = await _wait_event(c2, kind="promotion", primary=new)
        assert promo2["old_primary"] == first
        assert promo2["how"] == "hot" and promo2["takeover_ms"] > 0
        assert promo2["seq"] > max(ev["seq"] for ev in before)
        after = (await _events(c2, limit=PAGE_MAX))["events"]
        kept = {ev["seq"]: ev for ev in after}
        for ev in before:  # every earlier event, unchanged, on the new primary
            assert kept[ev["seq"]] == ev
        seqs = [ev["seq"] for ev in after]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        await c2.aclose()


async def test_host_close_open_unavail_and_back(tmp_path):
    async with running(tmp_path / "s", host_timeout=0.3) as ctl:
        w = await RawClient.connect(ctl.address, identity="worker@n1")
        await w.ok("join", {"role": "worker", "attrs": HOST_ATTRS})
        c = await RawClient.connect(ctl.address)
        added = await _wait_event(c, kind="host_state", host="n1", state="added")
        joined = await _wait_event(c, kind="member_join", identity="worker@n1")
        assert joined["role"] == "worker" and joined["candidate"] == ctl.address
        await c.ok("hostctrl", {"host": "n1", "action": "close", "comment": "disk", "user": "root"})
        closed = await _wait_event(c, kind="host_state", host="n1", state="closed")
        assert closed["comment"] == "disk" and "root" in closed["by"]
        await c.ok("hostctrl", {"host": "n1", "action": "open", "user": "root"})
        opened = await _wait_event(c, kind="host_state", host="n1", state="opened")
        # The worker stops beating: unavail after host_timeout; its next heartbeat: back.
        unavail = await _wait_event(c, kind="host_state", host="n1", state="unavail")
        await w.ok("heartbeat", {})
        back = await _wait_event(c, kind="host_state", host="n1", state="back")
        assert added["seq"] < closed["seq"] < opened["seq"] < unavail["seq"] < back["seq"]
        assert added["time"] <= closed["time"] <= unavail["time"] <= back["time"]
        await w.aclose()
        left = await _wait_event(c, kind="member_leave", identity="worker@n1")
        assert left["seq"] > back["seq"]
        # A heartbeat is never an event: one join, one leave for the worker.
        page = await _events(c, kind="member_join", limit=PAGE_MAX)
        assert [e["identity"] for e in page["events"]].count("worker@n1") == 1
        await c.aclose()


async def test_paging_every_event_exactly_once_while_new_ones_arrive(tmp_path):
    async with running(tmp_path / "s") as ctl:
        c = await RawClient.connect(ctl.address)
        got: list[int] = []
        cursor = 0
        made = 0
        for _round in range(30):
            for _ in range(7):  # new events between every page
                action = "close" if made % 2 == 0 else "open"
                await c.ok("queuectrl", {"queue": "normal", "action": action, "user": "root"})
                made += 1
            page = await _events(c, since_seq=cursor, limit=5, kind="queue_state")
            got.extend(e["seq"] for e in page["events"])
            cursor = page["next"]
        while True:  # drain
            page = await _events(c, since_seq=cursor, limit=5, kind="queue_state")
            got.extend(e["seq"] for e in page["events"])
            cursor = page["next"]
            if not page["more"]:
                break
        assert len(got) == made == len(set(got)) and got == sorted(got)
        # Unfiltered pages see the same events among the others, each once.
        everything: list[int] = []
        cursor = 0
        while True:
            page = await _events(c, since_seq=cursor, limit=3)
            everything.extend(e["seq"] for e in page["events"])
            cursor = page["next"]
            if not page["more"]:
                break
        assert everything == sorted(set(everything)) and set(got) <= set(everything)
        last = await _events(c, limit=4, last=True)
        assert [e["seq"] for e in last["events"]] == everything[-4:]
        since = await _events(c, since_time=last["events"][1]["time"], limit=PAGE_MAX)
        assert since["events"][0]["time"] >= last["events"][1]["time"]
        await c.aclose()


async def test_bad_input_is_answered_with_a_clear_error(tmp_path):
    async with running(tmp_path / "s") as ctl:
        c = await RawClient.connect(ctl.address)
        over = (await c.call("events", {"limit": PAGE_MAX + 1}))["error"]
        assert over["code"] == "INVALID" and "limit" in over["message"]
        kind = (await c.call("events", {"kind": "nonsense"}))["error"]
        assert kind["code"] == "INVALID" and "unknown kind 'nonsense'" in kind["message"]
        beyond = (await c.call("events", {"since_seq": 10**9}))["error"]
        assert beyond["code"] == "INVALID" and "beyond the newest event" in beyond["message"]
        neg = (await c.call("events", {"since_seq": -1}))["error"]
        assert neg["code"] == "INVALID" and "since_seq" in neg["message"]
        text = (await c.call("events", {"since_seq": "3"}))["error"]
        assert text["code"] == "INVALID"
        extra = (await c.call("events", {"bogus": 1}))["error"]
        assert extra["code"] == "INVALID" and "bogus" in extra["message"]
        assert (await _events(c))["events"]  # and it still serves
        await c.aclose()


async def test_retention_expires_from_the_head_and_from_the_store(tmp_path):
    state = tmp_path / "s"
    async with running(state, events_retention="1s") as ctl:
        c = await RawClient.connect(ctl.address)
        await c.ok("queuectrl", {"queue": "normal", "action": "close", "user": "root"})
        first = await _wait_event(c, kind="queue_state", state="closed")
        with anyio.fail_after(10):
            while (await _events(c))["oldest"] <= first["seq"]:
                await anyio.sleep(0.05)
        page = await _events(c, limit=PAGE_MAX)
        assert all(e["seq"] > first["seq"] for e in page["events"])
        await c.aclose()
    with sqlite3.connect(state / "state.db") as db:  # the expired ones left the store too
        stored = [int(k) for (k,) in db.execute("SELECT key FROM events")]
    assert first["seq"] not in stored  # (the later ones may have expired as well)
    async with running(state, events_max=3) as ctl:  # the cap
        c = await RawClient.connect(ctl.address)
        for i in range(6):
            await c.ok("queuectrl", {"queue": "normal", "action": ("open", "close")[i % 2],
                                     "user": "root"})
        with anyio.fail_after(10):
            while len((await _events(c, limit=PAGE_MAX))["events"]) > 3:
                await anyio.sleep(0.05)
        await c.aclose()


def test_event_log_pages_by_bisection_and_expires_from_the_head():
    log = EventLog(retention=100.0, cap=1000)
    t0 = time.time()
    for i in range(3000):
        log.record("host_state" if i % 3 else "queue_state", t0 + i * 0.01, host=f"h{i}",
                   queue="q", state="closed")
    assert len(log) == 3000 and log.seq == 3000
    assert len(log.expire(t0 + 30.0)) == 2000  # the cap: the oldest 2000 go
    page = log.page(since_seq=0, kind="queue_state", limit=10)
    assert page["events"][0]["seq"] > 2000 and page["more"]
    assert all(e["kind"] == "queue_state" for e in page["events"])
    # A clock that steps back never makes the log's time go back.
    ev = log.record("reconfig", t0 - 1000, by="root")
    assert ev["time"] >= page["events"][-1]["time"]
    log.forget([ev["seq"]])
    assert log.page(since_seq=3000)["events"] == []
