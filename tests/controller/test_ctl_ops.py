"""Every op against an in-process primary with a real SQLite store: lifecycle, errors, roles."""

from __future__ import annotations

import anyio
import pytest
from ctl_testlib import RawClient, join_synced, running

pytestmark = pytest.mark.anyio


async def worker(ctl, host="n1", ncpus=2) -> RawClient:
    w = await RawClient.connect(ctl.address, f"worker@{host}")
    await join_synced(w, {"role": "worker", "attrs": {"hname": host, "ncpus": ncpus}})
    return w


async def scheduler(ctl) -> RawClient:
    s = await RawClient.connect(ctl.address, "scheduler@ctl")
    await join_synced(s, {"role": "scheduler", "attrs": {}})
    return s


def err(msg):
    assert not msg["ok"], msg
    return msg["error"]


async def test_job_lifecycle_with_worker_and_scheduler(tmp_path):
    async with running(tmp_path) as ctl:
        w, s = await worker(ctl), await scheduler(ctl)
        cli = await RawClient.connect(ctl.address, "apiserver@laptop")
        jobid = (await cli.ok("jobsubmit", {"command": "true", "user": "alice", "ntasks": 2}))["jobid"]
        assert (await s.push("job"))["data"]["state"] == "PEND"
        r = await s.ok("jobdispatch", {"jobid": jobid, "alloc": [{"host": "n1", "ntasks": 2}]})
        assert r == {"jobid": jobid, "state": "RUN", "alloc": [{"host": "n1", "ntasks": 2}]}
        pushed = await w.push("job")
        assert pushed["data"]["jobid"] == jobid and pushed["data"]["state"] == "RUN"
        assert (await w.ok("notify_job", {"jobid": jobid, "event": "start", "pid": 4242}))["pid"] == 4242
        await w.ok("update_jusage", {"jobid": jobid, "usage": {"mem": 10}})
        await w.ok("update_resvals", {"values": {"r1m": 0.5}})
        assert (await cli.ok("resval", {"host": "n1"}))["hosts"]["n1"] == {"r1m": 0.5}
        hosts = (await cli.ok("hostinfo", {}))["hosts"]
        assert hosts[0]["used_slots"] == 2 and hosts[0]["state"] == "ok"
        # Host full: a second job cannot go there; admin force-run may.
        j2 = (await cli.ok("jobsubmit", {"command": "x", "user": "bob"}))["jobid"]
        on_n1 = {"jobid": j2, "alloc": [{"host": "n1", "ntasks": 1}]}
        assert err(await s.call("jobdispatch", on_n1))["code"] == "CONFLICT"
        assert err(await cli.call("jobdispatch", {**on_n1, "force": True, "user": "bob"}))["code"] == "DENIED"
        forced = await cli.ok("jobdispatch", {**on_n1, "force": True, "user": "root"})
        assert forced["state"] == "RUN"
        # Stop / resume / kill of a running job: signals to the worker.
        assert (await cli.ok("jobctrl", {"jobid": jobid, "action": "stop", "user": "alice"}))["state"] == "USUSP"
        assert (await w.push("signal"))["data"]["signal"] == "stop"
        assert (await cli.ok("jobctrl", {"jobid": jobid, "action": "resume", "user": "alice"}))["state"] == "RUN"
        assert (await w.push("signal"))["data"]["signal"] == "resume"
        assert err(await cli.call("jobctrl", {"jobid": jobid, "action": "kill", "user": "mallory"}))["code"] == "DENIED"
        await cli.ok("jobctrl", {"jobid": jobid, "action": "kill", "user": "alice"})
        assert (await w.push("signal"))["data"] == {"jobid": jobid, "signal": "kill", "hosts": ["n1"], "attempt": 0}
        done = await w.ok("notify_job", {"jobid": jobid, "event": "finish", "exit_status": 137})
        assert done["state"] == "EXIT" and done["exit_status"] == 137
        # Re-delivered completion: unchanged, no error.
        assert (await w.ok("notify_job", {"jobid": jobid, "event": "finish", "exit_status": 137}))["state"] == "EXIT"
        ok2 = await w.ok("notify_job", {"jobid": j2, "event": "finish", "exit_status": 0})
        assert ok2["state"] == "DONE"
        assert (await cli.ok("hostinfo", {"hosts": ["n1"]}))["hosts"][0]["used_slots"] == 0
        # requeue a finished job: PEND again with a new attempt
        rq = await cli.ok("jobctrl", {"jobid": j2, "action": "requeue", "user": "root"})
        assert rq["state"] == "PEND" and rq["attempt"] == 1 and rq["alloc"] == []
        by_state = await cli.ok("jobinfo", {"states": ["EXIT"]})
        assert [j["jobid"] for j in by_state["jobs"]] == [jobid]
        assert [j["jobid"] for j in (await cli.ok("jobinfo", {"owner": "bob"}))["jobs"]] == [j2]
        for c in (w, s, cli):
            await c.aclose()


async def test_pending_job_control_and_reasons(tmp_path):
    async with running(tmp_path) as ctl:
        s = await scheduler(ctl)
        cli = await RawClient.connect(ctl.address, "apiserver@laptop")
        j = (await cli.ok("jobsubmit", {"command": "x", "user": "alice", "queue": "priority"}))["jobid"]
        assert (await s.ok("set_pend_reason", {"reasons": {str(j): "no host fits"}})) == {"updated": 1}
        assert (await s.push("pend_reasons"))["data"]["reasons"] == {str(j): "no host fits"}
        assert (await cli.ok("jobinfo", {"jobids": [j]}))["jobs"][0]["pend_reason"] == "no host fits"
        assert (await s.ok("clear_reason", {})) == {"cleared": 1, "more": False}
        assert (await cli.ok("jobctrl", {"jobid": j, "action": "stop", "user": "alice"}))["state"] == "PSUSP"
        assert err(await cli.call("jobctrl", {"jobid": j, "action": "stop", "user": "alice"}))["code"] == "CONFLICT"
        on_n1 = {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}]}
        assert err(await s.call("jobdispatch", on_n1))["code"] == "CONFLICT"
        assert (await cli.ok("jobctrl", {"jobid": j, "action": "resume", "user": "alice"}))["state"] == "PEND"
        ckpt = {"jobid": j, "action": "checkpoint", "user": "alice"}
        assert err(await cli.call("jobctrl", ckpt))["code"] == "CONFLICT"
        k = await cli.ok("jobctrl", {"jobid": j, "action": "kill", "user": "alice"})
        assert k["state"] == "EXIT" and k["reason"] == "killed by owner alice"
        assert err(await cli.call("jobctrl", {"jobid": j, "action": "kill", "user": "alice"}))["code"] == "CONFLICT"
        assert err(await cli.call("jobctrl", {"jobid": 999, "action": "kill", "user": "alice"}))["code"] == "NOT_FOUND"


async def test_queue_and_host_control(tmp_path):
    async with running(tmp_path) as ctl:
        w, s = await worker(ctl), await scheduler(ctl)
        cli = await RawClient.connect(ctl.address, "apiserver@laptop")
        close = {"queue": "normal", "action": "close", "user": "alice"}
        assert err(await cli.call("queuectrl", close))["code"] == "DENIED"
        q = await cli.ok("queuectrl", {"queue": "normal", "action": "close", "user": "root"})
        assert q["status"] == "Closed:Active"
        assert (await s.push("queue"))["data"]["open"] is False
        assert err(await cli.call("jobsubmit", {"command": "x", "user": "a"}))["code"] == "CONFLICT"
        await cli.ok("queuectrl", {"queue": "normal", "action": "open", "user": "root"})
        admin = await RawClient.connect(ctl.address, "cli@ctl")
        await admin.ok("queuectrl", {"queue": "normal", "action": "inactivate"})
        j = (await cli.ok("jobsubmit", {"command": "x", "user": "a"}))["jobid"]
        e = err(await s.call("jobdispatch", {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}]}))
        assert e["code"] == "CONFLICT" and "inactive" in e["message"]
        await admin.ok("queuectrl", {"queue": "normal", "action": "activate"})
        h = await admin.ok("hostctrl", {"host": "n1", "action": "close", "comment": "maintenance"})
        assert h["state"] == "closed" and h["comment"] == "maintenance"
        assert (await w.push("host"))["data"]["state"] == "closed"
        e = err(await s.call("jobdispatch", {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}]}))
        assert e["code"] == "CONFLICT" and "closed" in e["message"]
        nope = {"jobid": j, "alloc": [{"host": "nope", "ntasks": 1}]}
        assert err(await s.call("jobdispatch", nope))["code"] == "CONFLICT"
        await admin.ok("hostctrl", {"host": "n1", "action": "open"})
        assert err(await admin.call("hostctrl", {"host": "zz", "action": "open"}))["code"] == "NOT_FOUND"
        qs = (await cli.ok("queueinfo", {}))["queues"]
        assert [x["name"] for x in qs] == ["priority", "normal"]
        conf = await cli.ok("clusterconf")
        assert conf["queues"] == ["priority", "normal"] and conf["default_queue"] == "normal"


async def test_host_timeout_and_rejoin(tmp_path):
    async with running(tmp_path, host_timeout=0.3) as ctl:
        w = await worker(ctl)
        s = await scheduler(ctl)
        j = (await (await RawClient.connect(ctl.address)).ok("jobsubmit", {"command": "x", "user": "a"}))["jobid"]
        with anyio.fail_after(5):
            while (await s.push("host"))["data"]["state"] != "unavail":
                pass
        e = err(await s.call("jobdispatch", {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}], "force": True}))
        assert e["code"] == "DENIED"  # only an administrator may force
        admin = await RawClient.connect(ctl.address, "cli@x")
        e = err(await admin.call("jobdispatch", {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}], "force": True}))
        assert e["code"] == "CONFLICT" and "unavail" in e["message"]
        await w.aclose()
        w2 = await worker(ctl)
        assert (await s.push("host"))["data"]["state"] == "ok"
        await w2.ok("heartbeat")
        await w2.aclose()


async def test_worker_sees_only_its_host(tmp_path):
    async with running(tmp_path) as ctl:
        w1, w2 = await worker(ctl, "n1"), await worker(ctl, "n2")
        s = await scheduler(ctl)
        cli = await RawClient.connect(ctl.address)
        j = (await cli.ok("jobsubmit", {"command": "x", "user": "a"}))["jobid"]
        await s.ok("jobdispatch", {"jobid": j, "alloc": [{"host": "n2", "ntasks": 1}]})
        assert (await w2.push("job"))["data"]["jobid"] == j
        await w1.ok("hello")  # round trip: anything for w1 has arrived by now
        assert [p["push"] for p in w1.pushes] == []
        assert err(await w1.call("notify_job", {"jobid": j, "event": "start", "pid": 1}))["code"] == "DENIED"
        # a re-joining worker's sync holds its host and its running jobs, no members
        _, st = await join_synced(w2, {"role": "worker", "attrs": {"hname": "n2", "ncpus": 2}})
        assert list(st.records("hosts")) == ["n2"] and list(st.records("jobs")) == [j]
        assert "members" not in st.kinds and st.records("cluster")["cluster"]["name"] == "xce"
        full = await RawClient.connect(ctl.address, "apiserver@web")
        _, st = await join_synced(full, {"role": "apiserver"})
        assert set(st.records("hosts")) == {"n1", "n2"} and st.count("jobs") == 1
        assert st.records("cluster")["cluster"]["name"] == "xce"
        assert set(st.records("queues")) == {"normal", "priority"}
        assert "apiserver@web" in st.records("members")


async def test_validation_errors_name_the_argument(tmp_path):
    async with running(tmp_path) as ctl:
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        cases = [
            ("jobsubmit", {"user": "a"}, "INVALID", "'command' is required"),
            ("jobsubmit", {"command": "x"}, "INVALID", "must name the user it acts for (argument 'user')"),
            ("jobsubmit", {"command": "x", "user": "a", "ntasks": "2"}, "INVALID", "'ntasks' must be int, got str"),
            ("jobsubmit", {"command": "x", "user": "a", "ntasks": True}, "INVALID", "'ntasks' must be int"),
            ("jobsubmit", {"command": "x", "user": "a", "ntasks": 0}, "INVALID", "'ntasks' must be >= 1"),
            ("jobsubmit", {"command": " ", "user": "a"}, "INVALID", "'command' must not be blank"),
            ("jobsubmit", {"command": "ls\x00", "user": "a"}, "INVALID", "found U+0000"),
            ("jobsubmit", {"command": "x", "user": "a", "cwd": "/t\x00"}, "INVALID", "'cwd' must not contain"),
            ("jobsubmit", {"command": "x", "user": "a", "env": {"A": 1}}, "INVALID", "'env.A' must be str, got int"),
            ("jobsubmit", {"command": "x", "user": "a", "bogus": 1}, "INVALID", "unknown argument 'bogus'"),
            ("jobsubmit", {"command": "x", "user": "a", "queue": "nope"}, "NOT_FOUND", "queue"),
            ("jobctrl", {"jobid": "1", "action": "kill", "user": "a"}, "INVALID", "'jobid' must be int"),
            ("jobctrl", {"jobid": 1, "action": "explode", "user": "a"}, "INVALID", "'action' must be one of"),
            ("jobctrl", {"jobid": 2**63, "action": "kill", "user": "a"}, "INVALID", "'jobid' must be <="),
            ("queuectrl", {"queue": "normal", "user": "root"}, "INVALID", "'action' is required"),
            ("hostctrl", {"host": 3, "action": "open", "user": "root"}, "INVALID", "'host' must be str"),
            ("jobdispatch", {"jobid": 1, "alloc": "n1", "user": "root"}, "INVALID", "'alloc' must be list"),
            ("jobdispatch", {"jobid": 1, "alloc": [{"host": "n1"}], "user": "root"}, "INVALID",
             "'alloc.0.ntasks' is required"),
            ("jobdispatch", {"jobid": 1, "alloc": [], "user": "root"}, "INVALID", "'alloc' is empty"),
            ("jobinfo", {"state": "WEIRD"}, "INVALID", "'state' must be one of"),
            ("nosuchop", {}, "INVALID", "unknown op 'nosuchop'"),
            ("heartbeat", {}, "NOT_JOINED", "join first"),
            ("notify_job", {"jobid": 1, "event": "start"}, "DENIED", "role 'apiserver'"),
        ]
        for op, args, code, text in cases:
            e = err(await cli.call(op, args))
            assert e["code"] == code and text in e["message"], (op, args, e)
        bad = await cli.call("jobsubmit", None)
        assert err(bad)["code"] == "INVALID"
        # nothing of that changed the state
        assert (await cli.ok("jobinfo"))["jobs"] == []


async def test_role_permissions(tmp_path):
    async with running(tmp_path) as ctl:
        w = await worker(ctl)
        s = await scheduler(ctl)
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        j = (await cli.ok("jobsubmit", {"command": "x", "user": "a"}))["jobid"]
        alloc = {"jobid": j, "alloc": [{"host": "n1", "ntasks": 1}]}
        for c, op, args in [
            (w, "jobdispatch", alloc), (w, "jobsubmit", {"command": "x", "user": "a"}),
            (w, "queuectrl", {"queue": "normal", "action": "close"}), (s, "notify_job", {"jobid": j, "event": "stop"}),
            (s, "update_jusage", {"jobid": j, "usage": {}}), (cli, "shutdown", {"user": "alice"}),
            (w, "shutdown", {}), (cli, "jobdispatch", {**alloc, "user": "alice"}),
        ]:
            assert err(await c.call(op, args))["code"] == "DENIED", (op, c.hello)
        other = await RawClient.connect(ctl.address, "scheduler@evil")
        assert err(await other.call("join", {"role": "worker", "attrs": {"hname": "n9"}}))["code"] == "DENIED"
        assert err(await w.call("update_resvals", {"values": {}, "host": "n2"}))["code"] == "DENIED"
        assert (await cli.ok("jobinfo"))["jobs"][0]["state"] == "PEND"


async def test_shutdown_by_admin(tmp_path):
    async with running(tmp_path) as ctl:
        s = await scheduler(ctl)
        admin = await RawClient.connect(ctl.address, "apiserver@x")
        assert await admin.ok("shutdown", {"user": "root"}) == {"server": ctl.address}
        assert (await s.push("shutdown"))["data"] == {"server": ctl.address}
        with anyio.fail_after(5):
            while ctl.role != "stopped":
                await anyio.sleep(0.01)
    assert (tmp_path / "primary").read_text() == ""


async def test_worker_rejoin_from_new_connection_replaces_old(tmp_path):
    async with running(tmp_path) as ctl:
        old = await worker(ctl, "n1")
        new = await worker(ctl, "n1")
        with anyio.fail_after(5):
            with pytest.raises((anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError)):
                await old.call("hello")
        status = await new.ok("status")
        assert status["members"] == 1 and status["hosts"] == 1
        assert "worker@n1" in ctl.state.members
