"""Pushes: state then gap-free deltas; a slow subscriber is dropped, nobody else stalls."""

from __future__ import annotations

import socket

import anyio
import pytest
from anyio.abc import SocketAttribute
from ctl_testlib import RawClient, running

pytestmark = pytest.mark.anyio


async def test_state_then_gap_free_deltas(tmp_path):
    async with running(tmp_path) as ctl:
        s = await RawClient.connect(ctl.address, "scheduler@a")
        await s.ok("join", {"role": "scheduler"})
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        for i in range(20):
            await cli.ok("jobsubmit", {"command": f"c{i}", "user": "u"})
        await s.ok("join", {"role": "scheduler"})  # re-join: a fresh state, seq goes on
        await s.ok("hello")
        seqs = [p["seq"] for p in s.pushes]
        assert seqs == list(range(1, len(seqs) + 1))
        events = [p["push"] for p in s.pushes]
        assert events[0] == "state" and events[1:21] == ["job"] * 20 and events[-1] == "state"
        assert len(s.pushes[-1]["data"]["jobs"]) == 20


async def test_slow_subscriber_is_dropped(tmp_path):
    async with running(tmp_path, max_subscriber_queue=20) as ctl:
        slow = await RawClient.connect(ctl.address, "apiserver@slow")
        sock = slow.stream.extra(SocketAttribute.raw_socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await slow.ok("join", {"role": "apiserver"})
        fast = await RawClient.connect(ctl.address, "scheduler@fast")
        await fast.ok("join", {"role": "scheduler"})
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        big = "x" * 30_000  # a command's limit is 32,768 characters: the env carries the rest
        got: list[dict] = []

        async def read_fast() -> None:
            while True:
                got.append(await fast.push(timeout=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_fast)
            with anyio.fail_after(30):
                for i in range(150):  # ~9 MB of pushes to a reader that never reads
                    await cli.ok("jobsubmit", {"command": big, "env": {"PAD": big}, "user": "u", "name": str(i)})
                while any(c.caller.identity == "apiserver@slow" for c in ctl.conns.values()):
                    await anyio.sleep(0.01)
                while sum(p["push"] == "job" for p in got) < 150:  # the fast one got them all
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert [p["seq"] for p in got] == list(range(1, len(got) + 1))
        left = [p["data"] for p in got if p["push"] == "member"]
        assert {"identity": "apiserver@slow", "role": "apiserver", "joined": False} in left
        assert all(c.caller.identity != "apiserver@slow" for c in ctl.conns.values())
        assert len(await cli.jobs()) == 150
        # it re-joins (new connection) and gets a full state
        again = await RawClient.connect(ctl.address, "apiserver@slow")
        await again.ok("join", {"role": "apiserver"})
        st = await again.push("state", timeout=20)
        assert len(st["data"]["jobs"]) == 150 and st["seq"] == 1
