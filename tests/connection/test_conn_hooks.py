"""The xce_reconnected contract: called under the lock, only on RE-connects; misuse is caught."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pluggy
import pytest
from clientkit import SpyHooks, make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore import hookspecs, rejoin
from xcecore.candidates import Candidate, parse_address
from xcecore.client import Client, HookContractError, SyncClient

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _fail_over(a: FakeController, b: FakeController) -> None:
    await a.kill()
    b.mode, b.primary = "primary", None


async def test_hook_called_once_per_reconnect_under_the_lock_not_at_first_connect(net, mocker):
    hooks = SpyHooks()
    spy = mocker.spy(hooks, "reconnected")
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController("b", net=net, store=store) as b:
        async with mem_client(net, make_config(a.address, b.address), role="w", hooks=hooks) as c:
            await c.connect()
            await c.call("hello")
            assert spy.call_count == 0  # never for the first connect
            await a.kill()
            await c.call("hello")
            assert spy.call_count == 1
            spy.assert_called_with(client=c, candidate=parse_address(b.address))
            await a.start()
            await b.kill()
            await c.call("hello")
            assert spy.call_count == 2
            assert not c.failover_locked  # released after the hook returned
        assert [held for _, held in hooks.reconnects] == [True, True]
        assert [cand for cand, _ in hooks.reconnects] == [parse_address(b.address),
                                                           parse_address(a.address)]


class _CallingHooks(SpyHooks):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.errors: list[BaseException] = []

    def reconnected(self, client: Client, candidate: Any) -> object:
        super().reconnected(client, candidate)
        if self.how == "sync-await":
            return self._call(client)
        if self.how == "list":  # what the pluggy facade returns: a list of results
            return [None, self._call(client)]
        return self._sync_facade(client)

    async def _call(self, client: Client) -> None:
        try:
            await client.call("hello")
        except HookContractError as exc:
            self.errors.append(exc)
            raise

    def _sync_facade(self, client: Client) -> None:
        # The facade used on the event-loop thread itself (a blocking call in a hook).
        try:
            SyncClient(client, portal=None).call("hello")  # type: ignore[arg-type]
        except HookContractError as exc:
            self.errors.append(exc)
            raise


@pytest.mark.parametrize("how", ["sync-await", "list", "sync-facade"])
async def test_hook_calling_the_client_raises_hook_contract_error_not_deadlock(net, how, logs):
    hooks = _CallingHooks(how)
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w",
                                                 hooks=hooks) as c:
        await c.connect()
        await a.restart()
        with anyio.fail_after(5), pytest.raises(HookContractError, match="xce_reconnected"):
            await c.call("hello")
        assert len(hooks.errors) == 1
        assert "xce_reconnected contract" in str(hooks.errors[0])
        assert not c.failover_locked
        assert await c.call("hello") == {"server": "a"}  # the connection itself is fine
    assert logs.find("broke its contract", "ERROR")


async def test_hook_spawning_a_task_that_calls_the_client_is_fine(net):
    """Calling from ANOTHER task is not the violation: it waits for the lock, then runs."""
    async with FakeController("a", net=net) as a:
        done: list[Any] = []

        class Hooks(SpyHooks):
            def reconnected(self, client: Client, candidate: Any) -> object:
                tg.start_soon(self._later, client)
                return None

            async def _later(self, client: Client) -> None:
                done.append(await client.call("hello"))

        async with anyio.create_task_group() as tg:
            async with mem_client(net, make_config(a.address), role="w", hooks=Hooks()) as c:
                await c.connect()
                await a.restart()
                await c.call("hello")
                with anyio.fail_after(5):
                    while not done:
                        await anyio.sleep(0.01)
        assert done == [{"server": "a"}]


async def test_builtin_rejoin_plugin_through_pluggy(net, mocker):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(rejoin, name="rejoin")
    spy = mocker.spy(pm.hook, "xce_reconnected")

    class Facade:
        def reconnected(self, client: Client, candidate: Candidate) -> object:
            return list(pm.hook.xce_reconnected(client=client, candidate=candidate))

        def connection_state(self, client: Client, state: str, candidate: Any,
                             detail: str) -> None:
            pass

        def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> None:
            pass

    async with FakeController("a", net=net) as a:
        a.require_join = {"jobdispatch"}
        async with mem_client(net, make_config(a.address), role="scheduler", hooks=Facade(),
                          rejoin_points=["jobdispatch"]) as c:
            await c.connect()
            await c.join()
            await a.restart()
            await c.call("hello")
            assert spy.call_count == 1
            assert c.rejoin_pending
            await c.call("jobdispatch")
            assert not c.rejoin_pending
        assert len(a.joins) == 2


async def test_sync_client_on_loop_thread_outside_hooks_is_refused_too(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        assert threading.get_ident() == c._loop_thread
        with pytest.raises(HookContractError, match="event-\\s*loop thread"):
            SyncClient(c, portal=None).call("hello")  # type: ignore[arg-type]
