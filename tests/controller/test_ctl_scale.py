"""The state model at scale, controller side (issue #17), over real TCP and a real SQLite
store: a streamed snapshot in bounded frames, a re-join inside the retention window that gets
only the deltas, paging that lists every job exactly once while jobs come and go, and the
idempotency filter's memory per remembered write."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from ctl_testlib import RawClient, follow, replica_for, running, start_controller, wait_listening
from xce_controller.ridfilter import RidFilter

from xcecore.client.sync import SyncToken

pytestmark = pytest.mark.anyio


async def _submit_many(cli: RawClient, n: int, **args: Any) -> list[int]:
    """``n`` pipelined submissions (all sent, then every reply read); their job ids."""
    ids = [await cli.send("jobsubmit", {"command": "true", "user": "u", **args}) for _ in range(n)]
    return [(await cli.reply(i, timeout=60))["result"]["jobid"] for i in ids]


async def _sync(member: RawClient, args: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Join with ``args``; the reply's ``sync`` and the pushes up to ``sync_end``."""
    member.pushes.clear()
    sync = (await member.ok("join", args))["sync"]
    frames = []
    while True:
        p = await member.push(timeout=30)
        frames.append(p)
        if p["push"] == "sync_end":
            return sync, frames


def _items(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [it for p in frames if p["push"] == "sync_records" and p["data"]["kind"] == kind
            for it in p["data"]["items"]]


async def test_a_snapshot_in_bounded_frames_then_only_the_deltas_on_a_rejoin(tmp_path):
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        jobids = await _submit_many(cli, 2_300)
        sub = {"jobs": "all", "queues": "all"}
        m = await RawClient.connect(ctl.address, "auditor@a")
        sync, frames = await _sync(m, {"role": "auditor", "subscribe": sub, "since": None})
        assert sync["mode"] == "snapshot" and frames[0]["push"] == "sync_begin"
        assert frames[0]["data"]["counts"]["jobs"] == 2_300
        jobs = _items(frames, "jobs")
        assert sorted(j["jobid"] for j in jobs) == jobids  # each job exactly once
        job_frames = [p for p in frames if p["push"] == "sync_records" and p["data"]["kind"] == "jobs"]
        assert len(job_frames) >= 3 and max(len(p["data"]["items"]) for p in job_frames) <= 1000
        assert {p["push"] for p in frames} == {"sync_begin", "sync_records", "sync_end"}
        assert all(j["rev"] <= sync["rev"] for j in jobs) and frames[-1]["data"]["rev"] == sync["rev"]
        token = {"store": sync["store"], "rev": sync["rev"]}
        await m.aclose()

        # Missed while away: three submissions and a kill. The re-join gets exactly those.
        new = await _submit_many(cli, 3)
        await cli.ok("jobctrl", {"jobid": jobids[10], "action": "kill", "user": "u"})
        m = await RawClient.connect(ctl.address, "auditor@a")
        sync, frames = await _sync(m, {"role": "auditor", "subscribe": sub, "since": token})
        assert sync["mode"] == "delta" and frames[0]["data"]["since"] == token["rev"]
        jobs = _items(frames, "jobs")
        assert sorted(j["jobid"] for j in jobs) == sorted([*new, jobids[10]])
        assert all(j["rev"] > token["rev"] for j in jobs)
        assert next(j for j in jobs if j["jobid"] == jobids[10])["state"] == "EXIT"

        # Another store's token, or none, is a snapshot again.
        sync, frames = await _sync(m, {"role": "auditor", "subscribe": sub,
                                       "since": {"store": "someone-else", "rev": token["rev"]}})
        assert sync["mode"] == "snapshot" and len(_items(frames, "jobs")) == 2_303
        # An empty subscription joins without a sync.
        nothing = await m.ok("join", {"role": "auditor", "subscribe": {}, "since": None})
        assert nothing["sync"] is None
        await m.aclose()
        await cli.aclose()


async def test_jobinfo_pages_list_every_job_once_while_jobs_come_and_go(tmp_path):
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        jobids = await _submit_many(cli, 3_000)
        await _submit_many(cli, 5, user="carol")
        untouched = set(jobids[::2])
        killed, added = [], []
        seen: Counter[int] = Counter()
        cursor, pages = None, 0
        while True:
            args: dict[str, Any] = {"limit": 100, "owner": "u"}
            if cursor is not None:
                args["cursor"] = cursor
            page = await cli.ok("jobinfo", args)
            seen.update(j["jobid"] for j in page["jobs"])
            assert len(page["jobs"]) <= 100
            pages += 1
            cursor = page["next"]
            if cursor is None:
                break
            # Between pages: kill a job not yet listed (it stays: EXIT) and submit one
            # (its id is above every listed one: it comes in a later page).
            victim = jobids[1 + 2 * (pages % 1_500)]
            await cli.ok("jobctrl", {"jobid": victim, "action": "kill", "user": "u"})
            killed.append(victim)
            added += await _submit_many(cli, 1)
        assert pages >= 30 and max(seen.values()) == 1, "a job listed twice"
        assert untouched <= set(seen) and set(killed) <= set(seen)
        assert set(added) <= set(seen), "jobs submitted while paging come in later pages"
        assert not {j for j in seen if j > max(jobids) and j not in added}, "carol's jobs filtered out"
        # Only pending ones: the killed jobs are gone from that listing, the rest appear once.
        pend = Counter(j["jobid"] for j in await cli.jobs({"owner": "u", "state": "PEND"}))
        assert max(pend.values()) == 1 and untouched <= set(pend) and not set(killed) & set(pend)
        # Nothing matching: an empty page with no cursor.
        assert await cli.ok("jobinfo", {"owner": "nobody"}) == {"jobs": [], "next": None}
        bad = await cli.call("jobinfo", {"cursor": "not-a-cursor"})
        assert not bad["ok"] and bad["error"]["code"] == "INVALID"
        await cli.aclose()


def test_the_idempotency_filter_keeps_under_100_bytes_a_remembered_write() -> None:
    f = RidFilter()
    n = 200_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            f.add(f"client-{i // 1000}:{i}", 1_000.0 + i / 1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(f) == n
    assert grown / n <= 100, f"{grown / n:.1f} bytes per remembered write"
    assert f.nbytes() / n <= 16
    assert f.may_contain("client-3:3000") and not f.may_contain("client-3:never")
    assert f.time_of("client-3:3000") == 1_003.0 and f.time_of("client-3:never") is None
    f.add("client-3:3000", 5_000.0)  # a repeat keeps one entry, the newer time
    assert len(f) == n and f.time_of("client-3:3000") == 5_000.0
    # The sweep forgets what is older than the TTL, a few partitions at a time.
    gone = sum(f.sweep(1_100.0, 512) for _ in range(8))
    assert gone == 100_000 - 1 and len(f) == n - gone
    assert f.may_contain("client-150:150000") and not f.may_contain("client-0:5")
    assert f.may_contain("client-3:3000")  # re-added later: kept


async def test_a_cold_primary_serves_writes_then_every_job(tmp_path):
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        jobids = await _submit_many(cli, 1_500)
        await cli.aclose()
        del ctl
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        assert "first_keyed_commit_ms" not in ctl.promotion  # no client write yet
        new = (await cli.ok("jobsubmit", {"command": "true", "user": "u"}))["jobid"]
        assert new > max(jobids), "ids continue from the store's"
        await cli.ok("jobsubmit", {"command": "true", "user": "u"}, rid="cli:first")
        first = ctl.promotion["first_keyed_commit_ms"]  # the first write with a key, committed
        assert 0 <= first < 60_000
        await cli.ok("jobsubmit", {"command": "true", "user": "u"}, rid="cli:second")
        assert ctl.promotion["first_keyed_commit_ms"] == first  # the first one's, kept
        with anyio.fail_after(30):
            while ctl.loading is not None:
                await anyio.sleep(0.01)
        listed = [j["jobid"] for j in await cli.jobs({"owner": "u"})]
        assert listed[:len(jobids) + 1] == [*jobids, new] and len(listed) == len(jobids) + 3
        assert ctl.promotion["how"] == "cold"
        await cli.aclose()


async def test_a_rejoin_gets_only_the_volatile_values_that_changed(tmp_path):
    """Pend reasons (no revs) of 3,000 jobs: a re-join to the same primary is sent the two
    that changed while it was away (and one cleared), and its replica ends as a whole sync
    would leave it; a since without the volatile position gets them whole."""
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        jobids = await _submit_many(cli, 3_000)
        args = {"role": "scheduler", "subscribe": {"jobs": "unfinished", "pend_reasons": "all"}}
        rep, token = replica_for(args), SyncToken()

        async def join(member: RawClient, since: Any) -> list[dict[str, Any]]:
            member.pushes.clear()
            await member.ok("join", {**args, "since": since})
            fed = await follow(member, rep)
            for p in fed:
                token.observe(p["push"], p["data"])
            return fed

        sched = await RawClient.connect(ctl.address, "scheduler@s")
        await join(sched, None)
        await sched.ok("set_pend_reason", {"reasons": {str(j): "queue inactive" for j in jobids}})
        p = await sched.push("pend_reasons")
        rep.apply(p["push"], p["data"])
        token.observe(p["push"], p["data"])  # the push's vseq moves the member's position
        assert rep.count("pend_reasons") == 3_000 and "vseq" not in rep.get("pend_reasons", jobids[0])
        since = token.since()
        assert since is not None and since["volatile"] == {"epoch": ctl.volatile.epoch,
                                                           "seq": p["data"]["vseq"]}
        await sched.aclose()

        other = await RawClient.connect(ctl.address, "scheduler@t")
        await other.ok("join", {"role": "scheduler", "subscribe": {}})
        await other.ok("set_pend_reason", {"reasons": {str(jobids[5]): "no host fits",
                                                       str(jobids[7]): "user limit"}})
        await other.ok("clear_reason", {"jobids": [jobids[9]]})
        back = await RawClient.connect(ctl.address, "scheduler@s")
        fed = await join(back, since)
        begin = fed[0]["data"]
        assert begin["mode"] == "delta" and begin["volatile"]["mode"] == "delta"
        reasons = _items([p for p in fed if p["push"] == "sync_records"], "pend_reasons")
        assert sorted(r["jobid"] for r in reasons) == [jobids[5], jobids[7]]
        assert [p["data"] for p in fed if p["push"] == "sync_removed"] == [
            {"kind": "pend_reasons", "keys": [jobids[9]]}]
        held = {k: r["reason"] for k, r in rep.records("pend_reasons").items()}
        want = {j: "queue inactive" for j in jobids if j != jobids[9]}
        want.update({jobids[5]: "no host fits", jobids[7]: "user limit"})
        assert held == want and rep.count("jobs") == 3_000

        # Without the volatile position (an older member's since): every reason, whole.
        fed = await join(back, {"store": since["store"], "rev": since["rev"]})
        assert fed[0]["data"]["mode"] == "delta" and fed[0]["data"]["volatile"]["mode"] == "whole"
        whole = _items([p for p in fed if p["push"] == "sync_records"], "pend_reasons")
        assert len(whole) == 2_999 and {r["jobid"]: r["reason"] for r in whole} == want
        assert {k: r["reason"] for k, r in rep.records("pend_reasons").items()} == want
        # Another primary term's position is not resumable: whole again.
        stale = {**token.since(), "volatile": {"epoch": "0" * 16, "seq": 1}}
        fed = await join(back, stale)
        assert fed[0]["data"]["volatile"]["mode"] == "whole"
        await back.aclose()
        await other.aclose()
        await cli.aclose()


def _huge_pages_available() -> bool:
    import platform

    lib, version = platform.libc_ver()
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return (lib == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
            and ("[always]" in thp or "[madvise]" in thp))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)


def test_a_candidate_keeps_its_heap_on_huge_pages_when_told_to(tmp_path):
    """A SIGKILLed primary's lock and sockets are released only once the kernel has torn its
    memory down: with XCE_CONTROLLER_HUGEPAGES=1 a candidate re-executes itself (same pid)
    with its heap on 2 MiB pages; without it, it does not."""
    on = start_controller(tmp_path / "state", tmp_path, env={"XCE_CONTROLLER_HUGEPAGES": "1"})
    off = None
    try:
        wait_listening(on.address, state="primary", timeout=60)
        off = start_controller(tmp_path / "state", tmp_path)
        wait_listening(off.address, state="standby")
        env_on, env_off = _environ(on.pid), _environ(off.pid)
        assert "PYTHONMALLOC" not in env_off and "re-executing" not in off.log.read_text()
        if not _huge_pages_available():
            assert "PYTHONMALLOC" not in env_on  # nothing to gain here: left alone
            return
        assert env_on["PYTHONMALLOC"] == "malloc"
        assert env_on["XCE_CONTROLLER_HUGEPAGES"] == "applied"  # executed again once, not more
        assert "glibc.malloc.hugetlb=1" in env_on["GLIBC_TUNABLES"]
        assert on.log.read_text().count("re-executing itself with its heap on transparent") == 1
        rollup = Path(f"/proc/{on.pid}/smaps_rollup").read_text()
        huge = next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("AnonHugePages"))
        assert huge > 0, rollup
    finally:
        on.kill()
        if off is not None:
            off.kill()


def test_huge_pages_by_default_only_for_a_large_file_store(tmp_path):
    """Unset, the switch puts the heap on huge pages when the store holds about 150,000 jobs
    or more (state.db and its WAL); ``0`` never, ``1`` always, ``applied`` never again."""
    from xce_controller.plugin import HUGEPAGE_AUTO_BYTES, _wants_huge_pages

    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    (small / "state.db").write_bytes(b"x" * 4096)
    with open(large / "state.db", "wb") as fh:  # sparse: its size is what is looked at
        fh.truncate(HUGEPAGE_AUTO_BYTES - 4096)
    (large / "state.db-wal").write_bytes(b"x" * 4096)
    assert _wants_huge_pages(None, str(large)) and not _wants_huge_pages(None, str(small))
    assert not _wants_huge_pages(None, str(tmp_path / "none-yet")) and not _wants_huge_pages(None, None)
    assert not _wants_huge_pages("0", str(large)) and _wants_huge_pages("1", str(small))
    assert not _wants_huge_pages("applied", str(large))


def test_a_candidate_on_a_large_store_takes_huge_pages_unasked(tmp_path):
    """A real candidate, no switch in its environment, on a store past the size: it
    re-executes itself onto huge pages (where the machine has them), once."""
    import sqlite3

    from xce_controller.plugin import HUGEPAGE_AUTO_BYTES, HUGEPAGE_SWITCH

    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "state.db")
    db.execute("CREATE TABLE padding (data BLOB)")  # the controller's tables come beside it
    db.execute("INSERT INTO padding VALUES (zeroblob(?))", (HUGEPAGE_AUTO_BYTES,))
    db.commit()
    db.close()
    proc = start_controller(state, tmp_path, env={HUGEPAGE_SWITCH: ""})  # unset: auto
    try:
        wait_listening(proc.address, state="primary", timeout=60)
        got = _environ(proc.pid)
        if not _huge_pages_available():
            assert "PYTHONMALLOC" not in got  # nothing to gain here: left alone
            return
        assert got["PYTHONMALLOC"] == "malloc" and got[HUGEPAGE_SWITCH] == "applied"
        assert proc.log.read_text().count("re-executing itself with its heap on transparent") == 1
    finally:
        proc.kill()


def test_xce_run_executes_again_before_the_role_starts(tmp_path):
    """Through ``xce run controller`` (a RoleSpec's exec_env) the candidate executes itself
    again onto huge pages before it logs that the role starts: the first interpreter does no
    more than load the config; the second one starts the role, once, and is the primary."""
    from xce_controller.plugin import HUGEPAGE_SWITCH

    from xcecore.testing.cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "cluster", 1)
    try:
        proc = cluster.spawn("controller0", "controller", f'controller.listen="{cluster.address(0)}"',
                             f'controller.state_dir="{cluster.state_dir}"',
                             env={HUGEPAGE_SWITCH: "1"})
        cluster.candidates[0] = proc
        cluster.wait_primary(60)
        got, text = _environ(proc.pid), proc.text()
        if not _huge_pages_available():
            assert "PYTHONMALLOC" not in got and "re-executing" not in text
            assert text.count("starting role controller") == 1
            return
        assert got["PYTHONMALLOC"] == "malloc" and got[HUGEPAGE_SWITCH] == "applied"
        lines = [line for line in text.splitlines()
                 if "re-executing itself" in line or "starting role controller" in line]
        assert len(lines) == 2 and "re-executing itself" in lines[0], lines
        assert f"pid {proc.pid}" in lines[1]  # the same process, executed again
    finally:
        cluster.close()


def test_a_candidate_started_on_huge_pages_does_not_execute_again(tmp_path):
    """An operator's unit that sets PYTHONMALLOC=malloc and the glibc tunable itself saves
    the second interpreter start: the candidate keeps the process it was started in."""
    from xce_controller.plugin import HUGEPAGE_ENV, HUGEPAGE_SWITCH

    proc = start_controller(tmp_path / "state", tmp_path, env={HUGEPAGE_SWITCH: "1", **HUGEPAGE_ENV})
    try:
        wait_listening(proc.address, state="primary", timeout=60)
        got = _environ(proc.pid)
        assert "re-executing" not in proc.log.read_text()
        assert got["PYTHONMALLOC"] == "malloc" and got[HUGEPAGE_SWITCH] == "1"  # untouched
    finally:
        proc.kill()


def test_build_validators_builds_every_op_s_validator():
    """What a standby runs on a thread while it stands by: every op's validator (and the
    delegated ops') is built after it, so a promotion's first requests find them built."""
    from xce_controller.ops import SCHEMAS, build_validators

    from xcecore.schema.delegated import compile_delegated

    delegated = compile_delegated()
    assert all(s._adapter is None for s in delegated.values())  # built on first use only
    build_validators(delegated)
    assert all(s._adapter is not None for s in (*SCHEMAS.values(), *delegated.values()))
    assert SCHEMAS["jobsubmit"].required == {"command"}
