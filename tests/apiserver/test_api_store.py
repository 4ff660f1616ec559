"""The API server's store on the replica: what the sync brings, the indexes it pages from,
and pages that stay exact while jobs change between them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from xce_apiserver.store import JobIndex, Store

pytestmark = pytest.mark.timeout(60)


def job(jobid: int, state: str = "PEND", user: str = "alice", queue: str = "normal",
        rev: int = 1) -> dict[str, Any]:
    return {"jobid": jobid, "state": state, "user": user, "queue": queue, "rev": rev}


def sync(store: Store, mode: str = "snapshot", end: bool = True, **kinds: list[dict[str, Any]]) -> None:
    store.apply("sync_begin", {"mode": mode, "store": "s1", "rev": 9, "since": None})
    for kind, items in kinds.items():
        store.apply("sync_records", {"kind": kind, "items": items})
    if end:
        store.apply("sync_end", {"rev": 9})


def test_ready_after_the_first_sync_and_not_while_a_snapshot_streams() -> None:
    s = Store()
    assert not s.ready
    sync(s, end=False, jobs=[job(1)])
    assert not s.ready and s.syncing
    s.apply("sync_end", {"rev": 9})
    assert s.ready and s.get_job(1)["state"] == "PEND"
    sync(s, mode="delta", end=False, jobs=[job(2)])
    assert s.ready, "a delta keeps the whole view: still ready"
    s.apply("sync_end", {"rev": 10})
    sync(s, end=False, jobs=[job(3)])
    assert not s.ready and s.get_job(1) is None  # a snapshot replaces the view
    s.apply("sync_end", {"rev": 11})
    assert s.ready and [j["jobid"] for j in s.page_jobs().jobs] == [3]


def test_hosts_queues_members_cluster_and_volatile_values() -> None:
    s = Store()
    sync(s, cluster=[{"name": "c", "resources": [{"name": "gpu", "type": "bool"}], "rev": 1}],
         queues=[{"name": "normal", "priority": 30, "rev": 1}, {"name": "hi", "priority": 50, "rev": 1}],
         hosts=[{"name": "n2", "state": "ok", "resvals": {}, "rev": 1}, {"name": "n1", "state": "ok", "rev": 1}],
         resvals=[{"host": "n1", "values": {"r1m": 0.5}}],
         members=[{"identity": "scheduler@x", "role": "scheduler"}],
         jobs=[job(1)], pend_reasons=[{"jobid": 1, "reason": "no slots"}])
    assert [q["name"] for q in s.snapshot_queues()] == ["hi", "normal"]
    version, hosts = s.snapshot_hosts()
    assert [h["name"] for h in hosts] == ["n1", "n2"] and hosts[0]["resvals"] == {"r1m": 0.5}
    assert s.site_resources()[1] == [{"name": "gpu", "type": "bool"}] and s.cluster["name"] == "c"
    assert list(s.members) == ["scheduler@x"]
    assert s.get_job(1)["pend_reason"] == "no slots"
    s.apply("resvals", {"host": "n2", "values": {"r1m": 2.0}})
    s.apply("jusage", {"jobid": 1, "usage": {"mem": 5}})
    s.apply("pend_reasons", {"reasons": {"1": None}})
    s.apply("member", {"identity": "scheduler@x", "role": "scheduler", "joined": False})
    assert s.snapshot_hosts()[0] > version and s.hosts["n2"]["resvals"] == {"r1m": 2.0}
    assert s.get_job(1)["usage"] == {"mem": 5} and "pend_reason" not in s.get_job(1)
    assert s.members == {}
    # A delta sync (a re-join): the volatile kinds are replaced, the rest is kept.
    sync(s, mode="delta")
    assert s.hosts["n1"].get("resvals") is None and s.get_job(1).get("usage") is None
    assert len(s.snapshot_queues()) == 2


def test_pages_follow_the_filters_from_the_smallest_index() -> None:
    s = Store()
    jobs = [job(i, state=("PEND", "RUN", "DONE")[i % 3], user=f"u{i % 4}", queue=("normal", "hi")[i % 2])
            for i in range(1, 1001)]
    sync(s, jobs=jobs)

    def everything(**filters: Any) -> list[int]:
        out, after, pages = [], 0, 0
        while True:
            page = s.page_jobs(after=after, limit=37, **filters)
            out += [j["jobid"] for j in page.jobs]
            pages += 1
            if page.next is None:
                return out
            assert len(page.jobs) == 37
            after = page.next

    assert everything() == list(range(1, 1001))
    expect = [j["jobid"] for j in jobs if j["state"] in ("PEND", "RUN") and j["user"] == "u1"
              and j["queue"] == "hi"]
    assert everything(states=["PEND", "RUN"], user="u1", queue="hi") == expect
    assert everything(user="nobody") == [] and everything(states=["PSUSP"]) == []
    # A filter that matches little costs a bounded scan: a short page, and a cursor on.
    page = s.page_jobs(user="u3", queue="normal", budget=50, limit=10)
    assert page.jobs == [] and page.next is not None and page.scanned == 50


def test_a_listing_returns_every_job_exactly_once_while_jobs_change() -> None:
    """Jobs that match throughout appear exactly once; jobs that come and go never twice."""
    rnd = random.Random(7)
    s = Store()
    sync(s, jobs=[job(i) for i in range(1, 3001)])
    stable = {i for i in range(1, 3001) if i % 5}  # never touched
    seen: list[int] = []
    after, next_id, rev = 0, 3001, 10
    while True:
        page = s.page_jobs(after=after, limit=50, states=["PEND"])
        seen += [j["jobid"] for j in page.jobs]
        if page.next is None:
            break
        after = page.next
        for _ in range(20):  # between pages: submissions, state changes, removals
            rev += 1
            pick = rnd.choice([i for i in range(1, next_id) if i % 5 == 0] or [5])
            action = rnd.random()
            if action < 0.3:
                s.apply("job", job(next_id, rev=rev))
                next_id += 1
            elif action < 0.7:
                s.apply("job", job(pick, state=rnd.choice(["RUN", "PEND", "DONE"]), rev=rev))
            else:
                s.apply("job_removed", {"jobids": [pick], "rev": rev})
    assert len(seen) == len(set(seen)), "no job twice"
    assert stable <= set(seen), "every job that matched throughout, once"


def test_the_index_follows_changes_of_each_field() -> None:
    index = JobIndex()
    index.put(1, None, job(1))
    index.put(2, None, job(2, user="bob"))
    index.put(1, job(1), job(1, state="RUN", queue="hi"))
    assert list(index.candidates(0, ["RUN"], None, None)) == [1]
    assert list(index.candidates(0, ["PEND"], None, None)) == [2]
    assert list(index.candidates(0, None, "alice", None)) == [1]
    assert list(index.candidates(1, None, None, None)) == [2]
    index.remove(1, job(1, state="RUN", queue="hi"))
    assert "hi" not in index.by["queue"] and "RUN" not in index.by["state"] and len(index) == 1


def test_an_inactive_queue_gives_its_pending_jobs_their_reason() -> None:
    """Derived from the queue's record (never pushed per job), over any reason pushed."""
    s = Store()
    sync(s, queues=[{"name": "normal", "priority": 30, "active": True, "rev": 1},
                    {"name": "parked", "priority": 10, "active": False, "rev": 1}],
         jobs=[job(1, queue="parked"), job(2), job(3, queue="parked", state="RUN")],
         pend_reasons=[{"jobid": 2, "reason": "no slots"}])
    assert s.get_job(1)["pend_reason"] == "queue is inactive"
    assert s.get_job(2)["pend_reason"] == "no slots"
    assert s.get_job(3).get("pend_reason") is None, "only pending jobs wait for their queue"
    assert [j.get("pend_reason") for j in s.page_jobs().jobs] == ["queue is inactive", "no slots", None]
    s.apply("queue", {"name": "parked", "priority": 10, "active": True, "rev": 2})
    s.apply("queue", {"name": "normal", "priority": 30, "active": False, "rev": 2})
    assert s.get_job(1).get("pend_reason") is None
    assert s.get_job(2)["pend_reason"] == "queue is inactive"
