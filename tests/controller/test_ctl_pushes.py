"""Pushes: a sync then gap-free deltas; a slow subscriber is dropped, nobody else stalls."""

from __future__ import annotations

import socket

import anyio
import pytest
from anyio.abc import SocketAttribute
from ctl_testlib import RawClient, follow, join_synced, replica_for, running

pytestmark = pytest.mark.anyio


async def test_a_sync_then_gap_free_deltas(tmp_path):
    async with running(tmp_path) as ctl:
        s = await RawClient.connect(ctl.address, "scheduler@a")
        await s.ok("join", {"role": "scheduler"})
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        for i in range(20):
            await cli.ok("jobsubmit", {"command": f"c{i}", "user": "u"})
        await s.ok("join", {"role": "scheduler"})  # re-join: a fresh sync, seq goes on
        rep = replica_for({"role": "scheduler"})
        fed = await follow(s, rep, syncs=2)
        seqs = [p["seq"] for p in fed]
        assert seqs == list(range(1, len(seqs) + 1))
        events = [p["push"] for p in fed]
        first = events.index("sync_end")
        assert events[0] == "sync_begin" and "job" not in events[:first]  # nothing yet
        assert events[first + 1:first + 21] == ["job"] * 20
        assert "sync_begin" in events[first + 21:] and events[-1] == "sync_end"  # the re-join's
        assert sorted(rep.records("jobs")) == list(range(1, 21)) and rep.complete


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
        left = [{k: v for k, v in p["data"].items() if k != "vseq"} for p in got if p["push"] == "member"]
        assert {"identity": "apiserver@slow", "role": "apiserver", "joined": False} in left
        assert all(c.caller.identity != "apiserver@slow" for c in ctl.conns.values())
        assert len(await cli.jobs()) == 150
        # it re-joins (new connection) and gets a full state
        again = await RawClient.connect(ctl.address, "apiserver@slow")
        _, st = await join_synced(again, {"role": "apiserver"})
        assert st.count("jobs") == 150 and again.ids and st.syncs == 1
