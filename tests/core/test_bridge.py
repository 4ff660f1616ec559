"""The one bridge between threads and the loop, the wake-up, the stop signal and the inbox."""

from __future__ import annotations

import threading

import anyio
import pytest

from xcecore.bridge import Inbox, LoopBridge, StopEvent, Wakeup

pytestmark = pytest.mark.timeout(30)


def test_a_thread_posts_and_calls_onto_the_loop() -> None:
    bridge = LoopBridge()
    assert not bridge.bound and not bridge.post(lambda: None)  # no loop: dropped, not raised
    with pytest.raises(RuntimeError, match="not running"):
        bridge.call(len, "abc")
    seen: list[tuple[str, int]] = []

    async def main() -> None:
        bridge.bind()
        assert bridge.bound and bridge.on_loop
        done = anyio.Event()

        def from_thread() -> int:
            assert not bridge.on_loop
            assert bridge.post(lambda: seen.append(("posted", threading.get_ident())))
            result = bridge.call(lambda x: x * 2, 21)
            assert bridge.post(done.set)
            return result

        assert await anyio.to_thread.run_sync(from_thread) == 42
        with anyio.fail_after(5):
            await done.wait()
        seen.append(("loop", threading.get_ident()))
        bridge.post(lambda: seen.append(("inline", threading.get_ident())))  # on the loop: at once
        bridge.unbind()

    anyio.run(main)
    loop_thread = seen[1][1]
    assert [s[0] for s in seen] == ["posted", "loop", "inline"]
    assert all(ident == loop_thread for _, ident in seen)  # everything ran on the loop's thread
    assert not bridge.post(lambda: None)


def test_wakeup_coalesces_and_re_arms() -> None:
    async def main() -> None:
        bridge = LoopBridge()
        bridge.bind()
        wake = Wakeup(bridge)
        wake.set()
        wake.set()
        assert wake.is_set()
        with anyio.fail_after(5):
            await wake.wait()  # two sets, one wake-up
        assert not wake.is_set()
        with anyio.move_on_after(0.05) as scope:
            await wake.wait()
        assert scope.cancelled_caught  # re-armed: nothing pending
        await anyio.to_thread.run_sync(wake.set)  # from a thread, through the bridge
        with anyio.fail_after(5):
            await wake.wait()

    anyio.run(main)


def test_stop_event_wakes_threads_and_tasks() -> None:
    async def main() -> None:
        bridge = LoopBridge()
        bridge.bind()
        stop = StopEvent(bridge)
        assert isinstance(stop, threading.Event)
        waiter = threading.Thread(target=stop.wait, args=(10,))
        waiter.start()
        async with anyio.create_task_group() as tg:
            woke = anyio.Event()

            async def task() -> None:
                await stop.wait_async()
                woke.set()

            tg.start_soon(task)
            await anyio.to_thread.run_sync(stop.set)  # set from another thread
            with anyio.fail_after(5):
                await woke.wait()
        await anyio.to_thread.run_sync(waiter.join, 5)
        assert not waiter.is_alive() and stop.is_set()
        with anyio.fail_after(1):
            await stop.wait_async()  # already set: returns at once

    anyio.run(main)


def test_inbox_keeps_order_and_times_out() -> None:
    box: Inbox[int] = Inbox()
    for i in range(3):
        box.put(i)
    assert len(box) == 3
    assert [box.get(1) for _ in range(3)] == [0, 1, 2]
    assert box.get(0.01) is None


def test_stop_event_callbacks_run_once_in_the_setting_thread() -> None:
    stop = StopEvent()  # no loop bound: callbacks do not need one
    ran: list[tuple[str, int]] = []
    stop.add_callback(lambda: ran.append(("before", threading.get_ident())))
    assert ran == []
    setter = threading.Thread(target=stop.set)
    setter.start()
    setter.join(5)
    assert [name for name, _ in ran] == ["before"]
    assert ran[0][1] == setter.ident  # in the thread that set it, not later on a loop
    stop.set()  # a second set runs nothing again
    assert len(ran) == 1
    stop.add_callback(lambda: ran.append(("after", threading.get_ident())))  # already set: now
    assert ran[-1] == ("after", threading.get_ident())
