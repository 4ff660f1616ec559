"""Per-owner plugin state: made once, shared across threads, dropped with its owner."""

from __future__ import annotations

import gc
import threading

import pytest

from xcecore.attached import Attached

pytestmark = pytest.mark.timeout(30)


class Owner:
    pass


def test_made_once_per_owner_and_found() -> None:
    made: list[Owner] = []
    slot: Attached[list[int]] = Attached(lambda owner: made.append(owner) or [])
    a, b = Owner(), Owner()
    assert slot(a) is slot(a) and slot(a) is not slot(b)
    assert made == [a, b]
    assert slot.find(Owner()) is None
    slot.forget(a)
    assert slot.find(a) is None


def test_concurrent_first_use_makes_one() -> None:
    calls = []
    slot: Attached[object] = Attached(lambda owner: calls.append(1) or object())
    owner = Owner()
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(slot(owner))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(g is got[0] for g in got)


def test_dropped_with_its_owner() -> None:
    slot: Attached[list[int]] = Attached(lambda owner: [1])
    owner = Owner()
    slot(owner)
    del owner
    gc.collect()
    assert len(slot._items) == 0
