"""Fixtures for the client tests: the in-memory network, loguru capture and hook spies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from clientkit import SpyHooks
from fakectl import FakeController
from loguru import logger

from xcecore.client.backend import MemoryNetwork


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class LogCapture:
    """Every loguru record emitted during a test, as ``(level, message)``."""

    records: list[tuple[str, str]] = field(default_factory=list)

    def messages(self, level: str | None = None) -> list[str]:
        return [m for lv, m in self.records if level is None or lv == level]

    def find(self, text: str, level: str | None = None) -> list[str]:
        return [m for m in self.messages(level) if text in m]


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    cap = LogCapture()

    def sink(message: Any) -> None:
        rec = message.record
        cap.records.append((rec["level"].name, rec["message"]))

    handler = logger.add(sink, level="DEBUG", format="{message}")
    try:
        yield cap
    finally:
        logger.remove(handler)


@pytest.fixture
def net() -> MemoryNetwork:
    """An in-process network: fake controllers listen on it, clients connect through it."""
    return MemoryNetwork()


@pytest.fixture
def hooks() -> SpyHooks:
    return SpyHooks()


class ThreadFakes:
    """Fake controllers on real loopback sockets, served by an event loop on another thread,
    for blocking clients under test on this one. ``portal`` runs coroutines on that loop
    (``fakes.portal.call(ctl.kill)``)."""

    def __init__(self, portal: BlockingPortal, stack: ExitStack) -> None:
        self.portal = portal
        self._stack = stack

    def __call__(self, name: str, **kw: Any) -> FakeController:
        """A started fake (stopped at teardown)."""
        ctl = FakeController(name, **kw)
        return self._stack.enter_context(self.portal.wrap_async_context_manager(ctl))

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run the coroutine function ``fn`` on the fakes' loop and wait for it."""
        return self.portal.call(fn)


@pytest.fixture
def thread_fakes() -> Iterator[ThreadFakes]:
    """A factory of TCP fake controllers running on a loop thread of their own."""
    with start_blocking_portal("asyncio") as portal, ExitStack() as stack:
        yield ThreadFakes(portal, stack)
