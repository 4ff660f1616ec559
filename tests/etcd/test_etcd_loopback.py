"""The etcd backend on loopback: three candidates, one real etcd member, real processes."""

from __future__ import annotations

import pytest
from xce_etcd.testing import EtcdCluster, etcd_config

from xcecore.testing.cluster import LocalCluster, wait_for
from xcecore.testing.workload import all_jobs

pytestmark = pytest.mark.timeout(120)


def config(etcd: EtcdCluster, prefix: str = "/xce") -> str:
    return '[controller]\nbackend = "etcd"\nadmins = ["t"]\n' + etcd_config(etcd.endpoints, prefix)


def test_failover_keeps_every_acknowledged_write(etcd_one: EtcdCluster, xce_cluster, xce_client) -> None:
    cluster: LocalCluster = xce_cluster(3, extra_config=config(etcd_one))
    c = xce_client(cluster, "cli", join=False)
    ids = [c.call("jobsubmit", {"command": "true", "queue": "normal"}, deadline=30)["jobid"]
           for _ in range(20)]
    old, new = cluster.kill_primary(30)
    assert new != old
    more = c.call("jobsubmit", {"command": "true"}, deadline=30)["jobid"]
    assert more > max(ids)
    jobs = {j["jobid"] for j in all_jobs(c)}
    assert set(ids) | {more} <= jobs
    text = cluster.logs()
    assert "won the election" in text


def test_status_shows_the_backend_and_the_lease_holder(etcd_one: EtcdCluster, xce_cluster) -> None:
    import subprocess
    import sys

    cluster: LocalCluster = xce_cluster(2, extra_config=config(etcd_one, "/st"))
    out = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cluster.config_path), "status"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("backend etcd"))
    assert f"lease holder {cluster.address(0)}, TTL 1 s" in line and "prefix /st" in line


def test_a_standby_that_followed_promotes_hot(etcd_one: EtcdCluster, xce_cluster, xce_client) -> None:
    """The standbys load the state once and follow the primary's commits through an etcd
    watch; the one that wins after the primary's SIGKILL catches up only what its watch had
    not delivered yet (up to its campaign's revision): no reload, every acknowledged job in."""
    cluster: LocalCluster = xce_cluster(3, extra_config=config(etcd_one, "/hot"))
    c = xce_client(cluster, "cli", join=False)
    first = c.call("jobsubmit", {"command": "true"}, deadline=30)["jobid"]
    primary = cluster.wait_primary(30)
    standbys = [p for i, p in cluster.candidates.items() if i != primary]
    for p in standbys:
        wait_for(lambda p=p: "standby: loaded" in p.text(), 60, what=f"{p.name}'s snapshot")
    ids = [first] + [c.call("jobsubmit", {"command": "true"}, deadline=30)["jobid"]
                     for _ in range(60)]
    c.call("jobctrl", {"jobid": ids[1], "action": "kill"}, deadline=30)  # a job's record changes too
    _old, new = cluster.kill_primary(30)
    st = c.call("status", deadline=30)
    p = st["promotion"]
    assert st["server"] == cluster.address(new) and p["how"] == "hot", p
    # one load, no reload (changes -1); it applied changes while standing by, not only at its
    # promotion (how many were left for the catch-up depends on the machine's load)
    assert p["snapshots"] == 1 and p["changes"] >= 0 and p["followed"] > p["changes"], p
    text = cluster.candidates[new].text()
    assert text.count("standby: loaded") == 1 and "promoted to primary (hot standby" in text
    assert "jobs load)" not in text  # the cold path's line
    jobs = {j["jobid"]: j for j in all_jobs(c)}
    assert set(ids) <= set(jobs) and jobs[ids[1]]["state"] != "PEND"
    assert c.call("jobsubmit", {"command": "true"}, deadline=30)["jobid"] > max(ids)


def test_events_survive_a_failover_on_etcd(etcd_one: EtcdCluster, xce_cluster, xce_client) -> None:
    """Cluster events are rows of the etcd store (``P/s/events/<seq>``): the candidate that
    wins after the primary's SIGKILL reads them back and continues their seqs."""
    cluster: LocalCluster = xce_cluster(2, extra_config=config(etcd_one, "/ev"))
    c = xce_client(cluster, "cli", join=False)
    for action in ("close", "open"):
        c.call("queuectrl", {"queue": "normal", "action": action}, deadline=30)

    def page() -> list[dict]:
        return list(c.call("events", {"limit": 1000}, deadline=30)["events"])

    wait_for(lambda: [e.get("state") for e in page() if e["kind"] == "queue_state"] == ["closed", "opened"],
             30, what="the queue events")
    before = page()
    old, new = cluster.kill_primary(30)
    assert new != old

    def promoted() -> list[dict]:
        try:
            evs = page()
        except Exception:  # UNAVAILABLE while the new primary reads its stored events
            return []
        return evs if any(e["kind"] == "promotion" and e["primary"] == cluster.address(new) for e in evs) else []

    after = wait_for(promoted, 30, what="the new primary's promotion event")
    kept = {e["seq"]: e for e in after}
    assert all(kept.get(e["seq"]) == e for e in before)
    promo = next(e for e in after if e["kind"] == "promotion" and e["primary"] == cluster.address(new))
    assert promo["seq"] > max(kept_seq for kept_seq in (e["seq"] for e in before))
    assert promo["old_primary"] == cluster.address(old)


def test_pipelined_writes_in_flight_across_a_sigkill_are_each_applied_once(
        etcd_one: EtcdCluster, xce_cluster, xce_client) -> None:
    """64 submissions in flight when the primary is SIGKILLed: every acknowledged one is
    there once, and no submission is there twice (a write that committed but whose reply
    was lost is found by its idempotency key, in its transaction's group, on the new
    primary: the client sends it again with the same key)."""
    import anyio

    from xcecore.client import Client
    from xcecore.runtime import client_config, load

    cluster: LocalCluster = xce_cluster(3, extra_config=config(etcd_one, "/once"))
    primary = cluster.wait_primary(30)
    for i, p in cluster.candidates.items():
        if i != primary:
            wait_for(lambda p=p: "standby: loaded" in p.text(), 60, what=f"{p.name}'s snapshot")
    _, cfg = load(cluster.config_path)
    acked: dict[str, int] = {}
    total, lanes = 1200, 64

    async def run() -> None:
        async with Client(client_config(cfg, "cli@once"), role="cli") as c:
            await c.connect()
            names = iter(f"p{k}" for k in range(total))

            async def lane() -> None:
                for name in names:
                    got = await c.call("jobsubmit", {"command": "true", "name": name},
                                       deadline=60)
                    acked[name] = got["jobid"]
                    if len(acked) == 300:  # writes in flight on every lane now
                        cluster.candidates[primary].kill()

            async with anyio.create_task_group() as tg:
                for _ in range(lanes):
                    tg.start_soon(lane)

    anyio.run(run)
    new = cluster.wait_primary(30, exclude=primary)
    assert len(acked) == total
    c = xce_client(cluster, "cli", join=False)
    jobs = all_jobs(c)
    by_name: dict[str, list[int]] = {}
    for j in jobs:
        by_name.setdefault(j["name"], []).append(j["jobid"])
    doubled = {n: ids for n, ids in by_name.items() if len(ids) > 1}
    assert not doubled, f"submissions applied twice: {list(doubled.items())[:5]}"
    assert all(by_name.get(n) == [i] for n, i in acked.items())
    assert "promoted to primary (hot standby" in cluster.candidates[new].text()


def test_a_keyed_write_is_found_after_a_whole_cluster_restart(
        etcd_one: EtcdCluster, xce_cluster, xce_client) -> None:
    """Every candidate SIGKILLed and started again (etcd keeps the state): a write sent again
    with the key of one that committed before gets that one's result, not a new job; a new
    key makes a new job."""
    cluster: LocalCluster = xce_cluster(2, extra_config=config(etcd_one, "/again"))
    c = xce_client(cluster, "cli", join=False)
    first = {f"k{i}": c.call("jobsubmit", {"command": "true", "name": f"k{i}"}, rid=f"rid-k{i}",
                             deadline=30)["jobid"] for i in range(20)}
    for p in cluster.candidates.values():
        p.kill()
    for i in cluster.candidates:
        cluster.start_candidate(i)
    cluster.wait_primary(60)
    c = xce_client(cluster, "cli", join=False)
    again = {n: c.call("jobsubmit", {"command": "true", "name": n}, rid=f"rid-{n}",
                       deadline=30)["jobid"] for n in first}
    assert again == first
    new = c.call("jobsubmit", {"command": "true", "name": "new"}, rid="rid-new", deadline=30)
    assert new["jobid"] > max(first.values())
    names = [j["name"] for j in all_jobs(c)]
    assert sorted(names) == sorted([*first, "new"])
