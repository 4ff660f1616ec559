"""Fixtures for the API server tests: a store filled by synthetic pushes, a fake backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from apikit import Api


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    a = Api()
    transport = httpx.ASGITransport(app=a.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        a.client = client
        yield a
