"""HA with real processes: three candidates on one state dir, SIGKILL of the primary."""

from __future__ import annotations

import os
import pwd

import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from ctl_testlib import RawClient, controllers, find_primary, handshake_state, wait_listening

pytestmark = pytest.mark.anyio
OWNER = pwd.getpwuid(os.geteuid()).pw_name  # under auth = "key" every caller is the owner


async def test_three_candidates_failover(tmp_path):
    state_dir, logs = tmp_path / "state", tmp_path / "logs"
    logs.mkdir()
    with controllers(state_dir, logs, 3) as procs:
        addresses = [p.address for p in procs]
        for a in addresses:
            wait_listening(a)
        primary = await find_primary(addresses)
        assert primary == procs[0].address  # started first, took the lock
        for standby in addresses[1:]:
            hs = await handshake_state(standby)
            assert hs["state"] == "standby" and hs["primary"] == primary
            s = await RawClient.connect(standby)
            err = (await s.call("jobsubmit", {"command": "x", "user": "u"}))["error"]
            assert err["code"] == "REDIRECT" and err["primary"] == primary
            await s.aclose()

        c = await RawClient.connect(primary)
        acked = [(await c.ok("jobsubmit", {"command": f"job {i}", "user": "alice"}, rid=f"sub-{i}"))["jobid"]
                 for i in range(50)]
        # A write that was sent but whose reply the client never saw: retried after failover.
        await c.send("jobsubmit", {"command": "in flight", "user": "alice"}, rid="inflight-1")
        procs[0].kill()

        new = await find_primary(addresses[1:])
        c2 = await RawClient.connect(new)
        retried = await c2.ok("jobsubmit", {"command": "in flight", "user": "alice"}, rid="inflight-1")
        again = await c2.ok("jobsubmit", {"command": "in flight", "user": "alice"}, rid="inflight-1")
        assert retried == again
        jobs = (await c2.ok("jobinfo", {}))["jobs"]
        ids = [j["jobid"] for j in jobs]
        assert set(acked) <= set(ids)
        assert sum(1 for j in jobs if j["command"] == "in flight") == 1
        # An acknowledged write retried on the new primary returns its stored result.
        assert (await c2.ok("jobsubmit", {"command": "job 7", "user": "alice"}, rid="sub-7"))["jobid"] == acked[7]
        assert len((await c2.ok("jobinfo", {}))["jobs"]) == len(jobs)
        # The remaining standby now redirects to the new primary.
        other = next(a for a in addresses[1:] if a != new)
        assert (await handshake_state(other))["primary"] == new
        status = await c2.ok("status")
        assert status["primary"] == new and len(status["candidates"]) == 2
        await c.aclose()
        await c2.aclose()
        log = next(p.log for p in procs if p.address == new).read_text()
        assert "promoted to primary" in log


async def test_candidate_on_held_state_dir_is_standby(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with controllers(tmp_path / "state", logs, 1) as procs:
        primary = await find_primary([procs[0].address])
        with controllers(tmp_path / "state", logs, 1, expect="standby") as late:
            wait_listening(late[0].address)
            hs = await handshake_state(late[0].address)
            assert hs == {"ok": True, "server": late[0].address, "state": "standby", "primary": primary,
                          "identity": {"user": OWNER, "uid": os.geteuid(), "gid": os.getegid(),
                                       "method": "key"}}


async def test_standby_names_the_primary_in_its_hello(tmp_path):
    """A client looking for the primary leaves a standby after its first message: no MAC is
    computed, no request is made, and the standby logs no warning for the closed handshake."""
    import anyio

    from xcecore import wire
    from xcecore.auth.key import KeyAuth
    from xcecore.candidates import parse_address
    from xcecore.client.link import open_link

    logs = tmp_path / "logs"
    logs.mkdir()
    with controllers(tmp_path / "state", logs, 2) as procs:
        primary = await find_primary([p.address for p in procs])
        standby = next(p for p in procs if p.address != primary)
        wait_listening(standby.address)
        host, _, port = standby.address.rpartition(":")
        async with await anyio.connect_tcp(host, int(port)) as raw:
            hello = await wire.read_message(BufferedByteReceiveStream(raw))
        assert hello["state"] == "standby" and hello["primary"] == primary
        assert hello["server"] == standby.address and "challenge" in hello
        dialed = await open_link(parse_address(standby.address), sender="w@x",
                                 auth=KeyAuth(b"wrong key"),
                                 connect_timeout=5.0, max_frame=1 << 20)
        assert dialed.stream is None and dialed.redirect == primary  # even with a wrong key
        # A client that authenticates anyway still gets the verdict in the third message.
        assert (await handshake_state(standby.address))["primary"] == primary
    text = standby.log.read_text()
    assert "WARNING" not in text.replace("no cluster key", ""), text


async def test_xce_run_controller_and_clean_stop(tmp_path):
    """``xce run controller`` (the core CLI) serves; SIGTERM withdraws the address and the lock."""
    import os
    import signal
    import subprocess
    import sys

    from ctl_testlib import KEY, REPO, free_port

    port = free_port()
    state = tmp_path / "state"
    cfg = tmp_path / "xce.toml"
    cfg.write_text(
        f'[cluster]\nname = "t"\npeers = "127.0.0.1:{port}"\nkey = "{KEY.decode()}"\n'
        f'[controller]\nstate_dir = "{state}"\n'
    )
    cmd = [sys.executable, "-m", "xcecore", "--config", str(cfg), "run", "controller",
           "--set", f'controller.listen="127.0.0.1:{port}"']
    log = tmp_path / "log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        address = f"127.0.0.1:{port}"
        wait_listening(address)
        assert await find_primary([address]) == address
        c = await RawClient.connect(address)
        assert (await c.ok("clusterconf"))["name"] == "t"
        await c.aclose()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
        assert (state / "primary").read_text() == ""
        assert "gave up the primary role" in log.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
