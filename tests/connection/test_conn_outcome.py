"""Unknown outcomes: which failures are "not applied" and which "maybe"; the outcome op.

First the client's decisions against the fake controller (in memory), then the controller's
``outcome`` op on real candidates, and last a kill storm with a 30 ms deadline whose checker
proves every BackendUnavailable unapplied and every OutcomeUnknown resolvable.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController, SharedStore, nowhere

from xcecore import wire
from xcecore.client import BackendUnavailable, Client, OutcomeUnknown
from xcecore.protocol import KEYED_WRITES
from xcecore.testing.cluster import LocalCluster

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


# --------------------------------------------------------------- the client's verdicts


async def test_keyed_write_sent_and_unanswered_past_its_deadline_is_unknown(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        a.hold_ops = {"jobsubmit"}
        with pytest.raises(OutcomeUnknown) as info:
            await c.call("jobsubmit", {"x": 1}, deadline=0.2)
        [sent] = a.ops("jobsubmit")
        assert info.value.rid == sent.rid and info.value.op == "jobsubmit"
        assert f"idempotency key {sent.rid}" in str(info.value)
        assert c.state == "degraded"


async def test_read_unanswered_past_its_deadline_is_backend_unavailable(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        a.hold_ops = {"jobinfo"}
        with pytest.raises(BackendUnavailable, match="deadline of 0.2 s"):
            await c.call("jobinfo", deadline=0.2)  # a read changes nothing: just retry it


async def test_write_never_sent_is_backend_unavailable(net):
    async with mem_client(net, make_config(nowhere(net), nowhere(net)), role="w") as c:
        with pytest.raises(BackendUnavailable):
            await c.call("jobsubmit", deadline=0.2)
        with pytest.raises(BackendUnavailable, match="retry budget of 1 exhausted"):
            await c.call("jobsubmit", retry_budget=1)


async def test_write_lost_with_its_link_when_the_budget_runs_out_is_unknown(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        a.drop_on_op, a.apply_before_drop, a.kill_on_drop = a.op_count + 1, True, True
        with pytest.raises(OutcomeUnknown) as info:
            await c.call("jobsubmit", {"x": 1}, retry_budget=1)
        assert info.value.rid == a.ops("jobsubmit")[0].rid
        assert isinstance(info.value.last_error, ConnectionError)
        assert len(a.store.applied) == 1  # it was applied: "unknown" was the truth


async def test_write_only_ever_redirected_is_backend_unavailable(net):
    """A REDIRECT is a definitive "not applied here": a write that got only those was not
    applied, however many times it was sent."""
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        a.mode, a.primary = "standby", a.address  # demoted, and knows no other primary
        with pytest.raises(BackendUnavailable):
            await c.call("jobsubmit", {"x": 1}, retry_budget=2)
        assert a.ops("jobsubmit") and not a.store.applied


async def test_an_earlier_lost_send_keeps_the_outcome_unknown(net):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, store=store, mode="standby") as b:
        b.primary = None  # after a dies, b answers NO_PRIMARY: nobody applies the retry
        async with mem_client(net, make_config(a.address, b.address), role="w") as c:
            await c.connect()
            a.drop_on_op, a.apply_before_drop, a.kill_on_drop = a.op_count + 1, True, True
            with pytest.raises(OutcomeUnknown):
                await c.call("jobsubmit", {"x": 1}, retry_budget=3)
        assert len(store.applied) == 1


async def test_caller_key_is_used_by_every_retry(net):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, store=store) as b:
        async with mem_client(net, make_config(a.address, b.address), role="w") as c:
            await c.connect()
            a.drop_on_op, a.kill_on_drop = a.op_count + 1, True
            first = await c.call("jobsubmit", {"x": 1}, rid="caller-key-1")
            again = await c.call("jobsubmit", {"x": 1}, rid="caller-key-1")
        assert first == again and len(store.applied) == 1
        assert {r.rid for r in [*a.ops("jobsubmit"), *b.ops("jobsubmit")]} == {"caller-key-1"}


async def test_outcome_asks_the_controller(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        a.handlers["outcome"] = lambda args: {"rid": args["rid"], "outcome": "not_applied"}
        assert await c.outcome("k1") == {"rid": "k1", "outcome": "not_applied"}
        assert a.ops("outcome")[0].args == {"rid": "k1"}


def test_keyed_writes_are_the_controllers_recorded_writes():
    """The client's list of writes with an outcome is the controller's: ops that are durable
    writes and store their result under the key."""
    from xce_controller.ops import OPS

    assert {op for op, spec in OPS.items() if spec.kind == "write" and spec.dedupe} == KEYED_WRITES


# ------------------------------------------------------------ the controller's outcome op


def _config(cluster: LocalCluster, sender: str) -> Any:
    from xcecore.runtime import client_config, load

    _, config = load(cluster.config_path)
    return client_config(config, sender)


async def _jobs_by_name(c: Client) -> Counter[str]:
    return Counter(name for name, _ in await _jobs(c))


async def _jobs(c: Client) -> list[tuple[str, int]]:
    """(name, jobid) of every job in the controller's state (every page of ``jobinfo``)."""
    out: list[tuple[str, int]] = []
    args: dict[str, Any] = {"user": "root", "limit": 1000}
    while True:
        page = await c.call("jobinfo", args)
        out += [(j["name"], j["jobid"]) for j in page["jobs"]]
        if page["next"] is None:
            return out
        args["cursor"] = page["next"]


async def test_outcome_answers_applied_or_makes_not_applied_final(xce_cluster):
    cluster = xce_cluster(2)
    async with Client(_config(cluster, "cli@outcome"), role="cli") as c:
        job = await c.call("jobsubmit", {"command": "true", "user": "root", "name": "applied"},
                           rid="key-applied")
        assert await c.outcome("key-applied") == {"rid": "key-applied", "outcome": "applied",
                                                  "result": job}
        never = {"rid": "key-never", "outcome": "not_applied"}
        assert await c.outcome("key-never") == never
        # The request arriving after that answer is refused, not applied.
        with pytest.raises(wire.RemoteError) as info:
            await c.call("jobsubmit", {"command": "true", "user": "root", "name": "late"},
                         rid="key-never")
        assert info.value.code == "CONFLICT" and info.value.data["outcome"] == "not_applied"
        assert await c.outcome("key-never") == never
        old = cluster.primary()
        assert old is not None
        await anyio.to_thread.run_sync(cluster.candidates[old].kill)
        # The tombstone is durable: the new primary answers the same, and still refuses.
        assert await c.outcome("key-never") == never
        with pytest.raises(wire.RemoteError, match="declared not applied"):
            await c.call("jobsubmit", {"command": "true", "user": "root", "name": "late"},
                         rid="key-never")
        assert (await c.outcome("key-applied"))["result"] == job
        assert await c.call("jobsubmit", {"command": "true", "user": "root", "name": "applied"},
                            rid="key-applied") == job  # a retry is answered, not re-applied
        assert await _jobs_by_name(c) == Counter({"applied": 1})


async def test_outcome_of_a_write_still_committing_is_pending(tmp_path: Path):
    """An in-process controller whose commit is held (a slow disk): the write is applied in
    memory but not durable, and ``outcome`` says so; once committed, it says applied."""
    from xce_controller.server import serve
    from xce_controller.settings import config_of, settings_from_config

    from xcecore.auth.key import KeyAuth
    from xcecore.candidates import parse_address
    from xcecore.client import ClientConfig

    key = KeyAuth(b"pending-test-key")
    section = {"listen": "127.0.0.1:0", "admins": ["root"], "state_dir": str(tmp_path)}
    conf = settings_from_config(config_of(controller=section), key)
    async with anyio.create_task_group() as tg:
        ctl = await tg.start(serve, conf)
        with anyio.fail_after(10):
            await ctl.promoted.wait()
        release = threading.Event()
        commit = ctl.store.commit_now

        def slow_commit(writes: Any) -> None:
            release.wait(10)  # the disk takes its time
            commit(writes)

        ctl.store.commit_now = slow_commit
        asked = anyio.Event()
        answer_outcome = ctl.outcome

        def outcome_spy(rid: str) -> dict[str, Any]:
            try:
                return answer_outcome(rid)
            finally:
                asked.set()

        ctl.outcome = outcome_spy
        cfg = ClientConfig((parse_address(ctl.address),), "cli@pending", key, heartbeat_interval=0)
        async with Client(cfg, role="cli") as writer, Client(cfg, role="cli") as asker:
            answers: list[Any] = []

            async def submit() -> None:
                answers.append(await writer.call("jobsubmit", {"command": "true"},
                                                 rid="key-slow"))

            async def ask() -> None:
                answers.append(await asker.outcome("key-slow"))

            async with anyio.create_task_group() as inner:
                inner.start_soon(submit)
                with anyio.fail_after(10):
                    while "key-slow" not in ctl.pending:
                        await anyio.sleep(0.005)
                inner.start_soon(ask)
                with anyio.fail_after(10):
                    await asked.wait()  # answered (its reply waits behind the commit)
                release.set()
            job = next(a for a in answers if "jobid" in a)
            assert {"rid": "key-slow", "outcome": "pending"} in answers
            assert await asker.outcome("key-slow") == {"rid": "key-slow", "outcome": "applied",
                                                       "result": job}
        tg.cancel_scope.cancel()


# ------------------------------------------------------------------------- the storm


async def test_short_deadline_kill_storm_every_failure_is_told_truly(xce_cluster):
    """Writers with a 30 ms deadline while the primary is SIGKILLed again and again (every
    other time after hanging it with SIGSTOP for 100 ms).

    Checked afterwards against the controller's state: every acknowledged write is there
    once; every BackendUnavailable is absent; every OutcomeUnknown is resolved -- half by
    ``outcome`` (applied: there once; not applied: absent, then its key refused, then sent
    again under a new key and applied once), half by retrying with the same key (applied
    once) -- and no write is there twice.
    """
    cluster = xce_cluster(3)
    rng = random.Random(1515)
    calls: list[tuple[str, str, Any]] = []  # (verdict, job name, jobid or rid)
    deadline = 0.03

    async with Client(_config(cluster, "cli@storm"), role="cli") as c:
        await c.connect()
        stop = anyio.Event()

        async def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                name = f"storm-{w}-{n}"
                args = {"command": "true", "user": "root", "name": name}
                try:
                    res = await c.call("jobsubmit", args, deadline=deadline)
                    calls.append(("ok", name, res["jobid"]))
                except OutcomeUnknown as exc:
                    calls.append(("unknown", name, exc.rid))
                except BackendUnavailable:
                    calls.append(("failed", name, None))
                await anyio.sleep(0.002)  # pacing, so that the killer's thread gets the GIL

        def seen(kind: str) -> int:
            return sum(1 for v, _, _ in calls if v == kind)

        async def killer() -> None:
            kills = 0
            while kills < 4 or (kills < 20 and (seen("unknown") < 3 or seen("failed") < 3)):
                # (a hot standby takes over in milliseconds: a 30 ms call is seldom failed
                # outright any more, so "failed" may not come at all within 20 kills)
                await anyio.sleep(rng.uniform(0.15, 0.4))
                old = await anyio.to_thread.run_sync(cluster.wait_primary, 30.0)
                if kills % 2:
                    # hung first, then killed: writes sent to it meanwhile outlive their 30 ms
                    # deadline unanswered (a killed primary alone is replaced so fast that a
                    # quick machine may see no write in flight past its deadline at all)
                    os.kill(cluster.candidates[old].pid, signal.SIGSTOP)
                    await anyio.sleep(0.1)
                os.kill(cluster.candidates[old].pid, signal.SIGKILL)
                await anyio.to_thread.run_sync(cluster.candidates[old].popen.wait, 10)
                kills += 1
                await anyio.to_thread.run_sync(lambda old=old: cluster.wait_primary(30.0, exclude=old))
                cluster.start_candidate(old)
                await anyio.to_thread.run_sync(cluster.wait_state, old, "standby", 30.0)
            stop.set()

        async with anyio.create_task_group() as tg:
            for w in range(3):
                tg.start_soon(writer, w)
            tg.start_soon(killer)

        # the hung primaries leave writes unanswered past their deadline: each must be told truly
        print("storm verdicts:", Counter(v for v, _, _ in calls))
        assert seen("unknown") >= 1, Counter(v for v, _, _ in calls)
        jobs = await _jobs(c)
        present, ids = Counter(name for name, _ in jobs), dict(jobs)
        retried: dict[str, int] = {}
        for verdict, name, value in calls:
            if verdict == "ok":
                assert present[name] == 1 and ids[name] == value, (name, "acknowledged but not there once")
            elif verdict == "failed":
                assert present[name] == 0, (name, "reported failed (BackendUnavailable) but applied")
        unknown = [(name, rid) for verdict, name, rid in calls if verdict == "unknown"]
        resolved: Counter[str] = Counter()
        for i, (name, rid) in enumerate(unknown):
            args = {"command": "true", "user": "root", "name": name}
            if i % 2:
                retried[name] = (await c.call("jobsubmit", args, rid=rid))["jobid"]  # the same key
                resolved["retried with its key"] += 1
                continue
            answer = await c.outcome(rid)
            with anyio.fail_after(10):
                while answer["outcome"] == "pending":
                    await anyio.sleep(0.01)
                    answer = await c.outcome(rid)
            resolved[f"outcome: {answer['outcome']}"] += 1
            if answer["outcome"] == "applied":
                assert present[name] == 1 and answer["result"]["jobid"] == ids[name]
                continue
            assert answer["outcome"] == "not_applied"
            assert present[name] == 0, (name, "outcome says not applied, but it is there")
            with pytest.raises(wire.RemoteError, match="declared not applied"):
                await c.call("jobsubmit", args, rid=rid)
            await c.call("jobsubmit", args)  # wanted still: again, under a new key
        print("storm calls:", dict(Counter(v for v, _, _ in calls)), "unknowns:", dict(resolved))
        jobs = await _jobs(c)
        final, ids = Counter(name for name, _ in jobs), dict(jobs)
        expected = {name for verdict, name, _ in calls if verdict in ("ok", "unknown")}
        assert {n for n in final if n.startswith("storm-")} == expected
        assert all(final[n] == 1 for n in expected), [n for n in expected if final[n] != 1]
        assert all(ids[name] == jobid for name, jobid in retried.items())  # applied once, by then
