"""The blocking facade from plain threads, and post_latest coalescing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from clientkit import make_config
from fakectl import FakeController, SharedStore

from xcecore.client import BackendUnavailable, Client, SyncClient

pytestmark = [pytest.mark.timeout(30)]


def _run_fake_in_thread(started: threading.Event, stop: threading.Event,
                        box: dict[str, FakeController], **kw: object) -> None:
    async def main() -> None:
        async with FakeController("t", **kw) as ctl:  # type: ignore[arg-type]
            box["ctl"] = ctl
            started.set()
            await anyio.to_thread.run_sync(stop.wait)

    anyio.run(main)


@pytest.fixture
def fake_in_thread():
    started, stop, box = threading.Event(), threading.Event(), {}
    t = threading.Thread(target=_run_fake_in_thread, args=(started, stop, box), daemon=True)
    t.start()
    assert started.wait(5)
    yield box["ctl"]
    stop.set()
    t.join(5)


def test_sync_client_from_plain_threads(fake_in_thread):
    ctl = fake_in_thread
    with SyncClient.open(make_config(ctl.address), role="cli", join_attrs={"a": 1}) as sc:
        assert sc.join()["role"] == "cli"
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: sc.call("jobsubmit", {"i": i}), range(50)))
        assert sorted(r["n"] for r in results) == list(range(1, 51))
        assert sc.heartbeat() is True
        assert sc.client.connected
    assert not sc.client.connected
    assert sc.client.state == "closed"


def test_sync_client_budget_error_propagates():
    from fakectl import free_port

    cfg = make_config(f"127.0.0.1:{free_port()}")
    with SyncClient.open(cfg, role="cli", connect=False) as sc, pytest.raises(
            BackendUnavailable):
        sc.call("hello", retry_budget=1)


@pytest.mark.anyio
async def test_post_latest_coalesces_while_disconnected(anyio_backend):
    async with FakeController("a") as a:
        async with Client(make_config(a.address), role="worker") as c:
            await c.connect()
            await a.kill()  # the controller is gone while the monitor keeps posting

            def monitor() -> None:  # a monitor thread: never blocks, whatever the link
                for i in range(100):
                    c.post_latest("load", "update_resvals", {"r1m": i})
                c.post_latest("mem", "update_resvals", {"mem": 1})

            await anyio.to_thread.run_sync(monitor)
            await anyio.sleep(0.1)
            assert not a.ops("update_resvals")
            await a.start()
            with anyio.fail_after(5):
                while len(a.ops("update_resvals")) < 2:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.05)
        assert [r.args for r in a.ops("update_resvals")] == [{"r1m": 99}, {"mem": 1}]


@pytest.mark.anyio
async def test_post_latest_from_the_loop_thread_too(anyio_backend):
    store = SharedStore()
    async with FakeController("a", store=store) as a, Client(make_config(a.address),
                                                             role="w") as c:
        await c.connect()
        c.post_latest("k", "update_resvals", {"v": 1})
        with anyio.fail_after(5):
            while not a.ops("update_resvals"):
                await anyio.sleep(0.01)
        assert a.ops("update_resvals")[0].args == {"v": 1}


@pytest.mark.anyio
async def test_sync_client_wrapping_a_running_client(anyio_backend):
    """The runtime's form: a Client and a BlockingPortal on the role's loop, monitors in threads."""
    from anyio.from_thread import BlockingPortal

    async with FakeController("a") as a, Client(make_config(a.address), role="w") as c, \
            BlockingPortal() as portal:
        sc = SyncClient(c, portal)
        results = [await anyio.to_thread.run_sync(sc.call, "jobsubmit", {"i": i})
                   for i in range(3)]
        assert [r["n"] for r in results] == [1, 2, 3]
        assert (await anyio.to_thread.run_sync(sc.join))["role"] == "w"


def test_sync_call_gives_up_when_the_role_stops(fake_in_thread) -> None:
    """A thread's call waiting for a reply that never comes is abandoned once the role's stop
    is set (no polling: the stop wakes the waiting thread), cancelled on the loop, and later
    calls are not sent."""
    from xcecore.bridge import LoopBridge, StopEvent
    from xcecore.client import ClientClosed

    ctl = fake_in_thread
    ctl.hold_ops = {"notify_job"}  # recorded, never answered
    with SyncClient.open(make_config(ctl.address), role="w") as owned:
        bridge = LoopBridge()
        owned.portal.call(bridge.bind)
        stop = StopEvent(bridge)
        sync = SyncClient(owned.client, owned.portal, stop=stop)
        assert sync.call("hello") == {"server": "t"}
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        with pytest.raises(ClientClosed, match="abandoned"):
            sync.call("notify_job", {"jobid": 1})
        timer.join()
        assert [r.args for r in ctl.ops("notify_job")] == [{"jobid": 1}]
        with pytest.raises(ClientClosed, match="not sent"):
            sync.call("notify_job", {"jobid": 2})
        # The abandoned call's task was cancelled on the loop: none of the client's blocking
        # calls is still running there, and the owner's own facade still works.
        assert owned.portal.call(_blocking_tasks, owned.client) == 0
        assert owned.call("hello") == {"server": "t"}
        owned.portal.call(bridge.unbind)
    assert len(ctl.ops("notify_job")) == 1


async def _blocking_tasks(client: Client) -> int:
    """How many of ``client``'s blocking-call tasks still run, once the cancellation posted
    by the stop had a chance to end them (0 expected; waits up to 5 s for it)."""

    def running() -> int:
        return sum(1 for t in anyio.get_running_tasks()
                   if t.name and t.name.startswith(client._name) and "blocking call" in t.name)

    with anyio.move_on_after(5):
        while running():
            await anyio.sleep(0.01)
    return running()
