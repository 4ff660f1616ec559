"""``jobdispatch_many``: a batch of good and refused allocations in one write (a primary with
a real SQLite store over real TCP), and exactly-once across a SIGKILL of the primary while
batches are in flight (three controller processes)."""

from __future__ import annotations

import pytest
from ctl_testlib import RawClient, controllers, find_primary, join_synced, running, wait_listening

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def one(host: str, n: int = 1) -> list[dict[str, object]]:
    return [{"host": host, "ntasks": n}]


async def join_worker(address: str, host: str, ncpus: int) -> RawClient:
    w = await RawClient.connect(address, f"worker@{host}")
    await join_synced(w, {"role": "worker", "attrs": {"hname": host, "ncpus": ncpus}})
    return w


async def join_scheduler(address: str) -> RawClient:
    s = await RawClient.connect(address, "scheduler@ctl")
    await join_synced(s, {"role": "scheduler", "attrs": {}})
    return s


async def test_batch_applies_each_allocation_on_its_own(tmp_path):
    async with running(tmp_path) as ctl:
        n1, n2 = await join_worker(ctl.address, "n1", 2), await join_worker(ctl.address, "n2", 2)
        s = await join_scheduler(ctl.address)
        cli = await RawClient.connect(ctl.address, "apiserver@laptop")

        async def submit(**extra: object) -> int:
            job = await cli.ok("jobsubmit", {"command": "true", "user": "alice", **extra})
            return int(job["jobid"])

        j1, j2, j3, j4, j5, j6 = [await submit() for _ in range(6)]
        wide = await submit(ntasks=2)
        arr = await submit(array="1-3")
        n1.pushes.clear()
        batch = [
            {"jobid": j1, "alloc": one("n1")},
            {"jobid": j2, "alloc": one("n1")},
            {"jobid": j3, "alloc": one("n1")},  # n1 is full after the two before it
            {"jobid": j4, "alloc": one("nope")},  # unknown host
            {"jobid": wide, "alloc": one("n2")},  # 1 task for a job of 2
            {"jobid": 999_999, "alloc": one("n2")},  # no such job
            {"jobid": j1, "alloc": one("n2")},  # dispatched by the first item
            {"jobid": j5, "alloc": one("n2")},
            {"jobid": arr, "alloc": one("n2"), "more": [one("n2")]},  # n2 has 1 slot left
            {"jobid": j6, "alloc": one("n2"), "more": [one("n2")]},  # not an array
        ]
        res = await s.ok("jobdispatch_many", {"dispatches": batch}, rid="batch-1")
        assert (res["dispatched"], res["refused"]) == (3, 7)
        got = res["results"]
        assert [r["jobid"] for r in got] == [item["jobid"] for item in batch]
        assert [r.get("state") or r["code"] for r in got] == [
            "RUN", "RUN", "CONFLICT", "CONFLICT", "INVALID", "NOT_FOUND", "CONFLICT", "RUN",
            "CONFLICT", "INVALID"]
        assert "n1 has 0 free slots" in got[2]["message"]
        assert "nope is unknown" in got[3]["message"]
        assert "needs 2" in got[4]["message"]
        assert "not PEND" in got[6]["message"]
        assert "n2 has 1 free slots" in got[8]["message"]
        assert "not an array" in got[9]["message"]

        # The state: exactly the three accepted, slots taken once each.
        states = {j["jobid"]: j["state"] for j in await cli.jobs()}
        assert [states[j] for j in (j1, j2, j3, j4, j5, j6, wide, arr)] == [
            "RUN", "RUN", "PEND", "PEND", "RUN", "PEND", "PEND", "PEND"]
        used = {h["name"]: h["used_slots"] for h in (await cli.ok("hostinfo", {}))["hosts"]}
        assert used == {"n1": 2, "n2": 1}
        # n1's worker: its two jobs and its host record once for the batch (a reply to a
        # later request comes after every push queued before it).
        await n1.ok("heartbeat", {})
        pushed = [(p["push"], p["data"].get("jobid"), p["data"].get("used_slots")) for p in n1.pushes]
        assert sorted(p for p in pushed if p[0] == "job") == [("job", j1, None), ("job", j2, None)]
        assert [p for p in pushed if p[0] == "host"] == [("host", None, 2)]

        # The key's repeat is answered the stored result and changes nothing.
        again = await s.ok("jobdispatch_many", {"dispatches": batch}, rid="batch-1")
        assert again == res
        used = {h["name"]: h["used_slots"] for h in (await cli.ok("hostinfo", {}))["hosts"]}
        assert used == {"n1": 2, "n2": 1}

        # An array item: its lowest pending indexes, as elements of their own.
        await n2.ok("heartbeat", {})
        res = await s.ok("jobdispatch_many", {"dispatches": [
            {"jobid": arr, "alloc": one("n2")}, {"jobid": j3, "alloc": one("n2")}]})
        assert res["results"][0]["state"] == "RUN"
        assert [e["index"] for e in res["results"][0]["elements"]] == [1]
        assert res["results"][1]["code"] == "CONFLICT"  # n2 full again

        # Malformed: INVALID for the whole request, nothing applied.
        bad = await s.call("jobdispatch_many", {"dispatches": [
            {"jobid": j3, "alloc": one("n1")}, {"jobid": j4, "alloc": []}]})
        assert not bad["ok"] and bad["error"]["code"] == "INVALID"
        assert (await s.call("jobdispatch_many", {"dispatches": []}))["error"]["code"] == "INVALID"
        # Only the scheduler (or an administrator's client) dispatches.
        denied = await n1.call("jobdispatch_many", {"dispatches": [{"jobid": j3, "alloc": one("n1")}]})
        assert denied["error"]["code"] == "DENIED"
        for c in (n1, n2, s, cli):
            await c.aclose()


async def test_sigkill_of_the_primary_while_batches_are_in_flight(tmp_path):
    """Batches sent (keyed), the primary SIGKILLed before their replies are read; the same
    batches sent again under the same keys to the new primary: each job RUN exactly once."""
    state_dir, logs = tmp_path / "state", tmp_path / "logs"
    logs.mkdir()
    hosts, per_host, batches, size = 20, 10, 8, 25  # 200 jobs, 200 slots
    with controllers(state_dir, logs, 3) as procs:
        addresses = [p.address for p in procs]
        for a in addresses:
            wait_listening(a)
        primary = await find_primary(addresses)
        workers = [await join_worker(primary, f"h{i:02d}", per_host) for i in range(hosts)]
        cli = await RawClient.connect(primary, "apiserver@laptop")
        jobids = [(await cli.ok("jobsubmit", {"command": "true", "user": "alice"},
                                rid=f"sub-{i}"))["jobid"] for i in range(hosts * per_host)]
        s = await join_scheduler(primary)
        plan = [[{"jobid": jobids[b * size + k], "alloc": one(f"h{(b * size + k) % hosts:02d}")}
                 for k in range(size)] for b in range(batches)]
        # The first batch is acknowledged; the rest are on the wire when the primary dies.
        first = await s.ok("jobdispatch_many", {"dispatches": plan[0]}, rid="b-0")
        assert first["dispatched"] == size
        for b in range(1, batches):
            await s.send("jobdispatch_many", {"dispatches": plan[b]}, rid=f"b-{b}")
        next(p for p in procs if p.address == primary).kill()
        for c in (*workers, cli, s):
            await c.aclose()

        new = await find_primary([a for a in addresses if a != primary], timeout=30)
        workers = [await join_worker(new, f"h{i:02d}", per_host) for i in range(hosts)]
        s = await join_scheduler(new)
        for b in range(batches):  # every batch again, under its key: none is applied twice
            res = await s.ok("jobdispatch_many", {"dispatches": plan[b]}, rid=f"b-{b}")
            assert [r.get("state") for r in res["results"]] == ["RUN"] * size, res
        cli = await RawClient.connect(new, "apiserver@laptop")
        sent = {item["jobid"] for batch in plan for item in batch}
        jobs = {j["jobid"]: j for j in await cli.jobs()}
        assert len(jobs) == hosts * per_host
        for jobid, job in jobs.items():
            if jobid in sent:
                assert job["state"] == "RUN" and job["attempt"] == 0, job
                assert [a["ntasks"] for a in job["alloc"]] == [1]
            else:
                assert job["state"] == "PEND", job
        used = {h["name"]: h["used_slots"] for h in (await cli.ok("hostinfo", {}))["hosts"]}
        want: dict[str, int] = {}
        for batch in plan:
            for item in batch:
                want[item["alloc"][0]["host"]] = want.get(item["alloc"][0]["host"], 0) + 1
        assert {h: n for h, n in used.items() if n} == want
        assert sum(used.values()) == len(sent)
        for c in (*workers, cli, s):
            await c.aclose()
