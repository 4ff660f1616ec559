"""Fan-out bookkeeping: O(1) removal of workers by connection id, host re-joins."""

from __future__ import annotations

import pytest
from xce_controller.pushes import Fanout, Outbox, Subscriber, encode_events
from xce_controller.state import Event

pytestmark = pytest.mark.timeout(30)


def _sub(identity: str, host: str | None) -> Subscriber:
    return Subscriber(identity, Outbox(100, 100), host, lambda: None)


def test_remove_worker_by_cid_and_member():
    f = Fanout("s")
    f.add(1, _sub("worker@a", "a"))
    f.add(2, _sub("worker@b", "b"))
    f.add(3, _sub("scheduler@x", None))
    f.remove(1)
    assert set(f.workers) == {"b"}
    f.remove(3)
    assert not f.members
    f.remove(99)  # unknown: a no-op
    assert set(f.workers) == {"b"}


def test_rejoined_host_is_not_removed_by_its_old_connection():
    f = Fanout("s")
    f.add(1, _sub("worker@a", "a"))
    f.add(2, _sub("worker@a", "a"))  # the host re-joined on a new connection
    f.remove(1)  # the old connection closes later
    assert f.workers["a"][0] == 2
    f.remove(2)
    assert not f.workers


def test_member_events_go_to_non_workers_only():
    f = Fanout("s")
    w, m = _sub("worker@a", "a"), _sub("scheduler@x", None)
    f.add(1, w)
    f.add(2, m)
    f.publish(encode_events([Event("member", {"identity": "worker@b", "joined": True})], {}), None)
    assert m.outbox.queued_pushes == 1 and w.outbox.queued_pushes == 0
