"""Fixtures for the client tests: the in-memory network, loguru capture and hook spies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from clientkit import SpyHooks
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
