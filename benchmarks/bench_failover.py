"""Failover latency under a sequential writer, with every role of a real cluster up.

Run from the repository root::

    python benchmarks/bench_failover.py [--kills 50] [--quick]
    python benchmarks/bench_failover.py --fault stop [--kills 30] [--hung-timeout 2] [--liveness 3]
    python benchmarks/bench_failover.py --auth munge [--kills 50]     (as root: runs a munged)
    python benchmarks/bench_failover.py --tls [--kills 50]
    python benchmarks/bench_failover.py --backend etcd [--fault kill|stop] [--kills 30]
    python benchmarks/bench_failover.py --backend etcd --fault poweroff|freeze [--kills 12]  (root)

``--backend etcd`` runs the candidates on the etcd backend (plugins/etcd) over a real
three-member etcd on loopback (the tuned flags of the operator's guide, lease TTL 1 s, and
the writer's ``[client] liveness_timeout`` 1 s, as the guide advises with that TTL: a
primary silent for a TTL has lost its lease, so a client waiting longer only waits);
there a stopped primary is not fenced by a signal: its lease expires and a standby wins the
election (the stopped process is then SIGKILLed by the benchmark before its restart).

``--backend etcd --fault poweroff|freeze`` runs on the fault test bed instead (as root:
``xce_etcd.chaos``'s three hosts, each an etcd member and a candidate, two recorded writers on
a client host): the primary's whole host is powered off (its links and every process on it,
etcd member included) or frozen (every process SIGSTOPped), held 1-2.5 s, undone, and the
next fault follows once a write was acknowledged after it and every candidate is up again (a
primary woken from a freeze gives its role up and is restarted, which takes seconds on a
loaded machine: a fault meanwhile would find no standby). Per fault: ``first_write`` (the
fault -> the first acknowledged write issued after it, the same method), ``promotion`` (the
fault -> the next "promoted to primary" line of a candidate's log) and whether etcd's raft
leader was on the primary's host when it struck (the primary moves it off, xce_etcd.placement).
Writes ``failover-poweroff-etcd.json`` / ``failover-freeze-etcd.json``.

``--fault kill`` (the default) SIGKILLs the primary; ``--fault stop`` SIGSTOPs it instead (a
hung primary: it keeps the state-directory lock until a standby sees its heartbeat stop for
``[controller] hung_timeout`` and fences it, SIGKILL of the verified lock holder). ``--liveness``
sets the writer's ``[client] liveness_timeout`` (the cluster's own is 1.5 s).

Three controller candidates, two workers, the scheduler and the API server run as real
``xce run`` processes on loopback. One client (the real ``Client`` library) writes
sequentially (``jobsubmit``, one at a time, 5 ms apart; jobs go to an inactive queue so the
cluster is not loaded by them). After 0.5-1.5 s (random) of steady writing, the primary is
SIGKILLed while the writer's request is outstanding (sent, reply not yet received). Per kill:

- ``promotion``: kill -> the new primary's promotion time (``status.since``, its own clock);
- ``inflight_ack``: kill -> the acknowledgement of the write that was in flight;
- ``first_write``: kill -> the acknowledgement of the first write issued after the kill
  (the BENCHMARKS.md method; a sequential writer issues it once the in-flight one returns);
- ``rejoin[role]``: kill -> the role's ``joined_at`` in the new primary's ``status``
  ``member_list`` (its own clock); the roles' "re-joined as" log lines (millisecond
  timestamps) are recorded too, as a cross-check (and used if ``member_list`` is missing);
- ``all_rejoined``: the last of those.

Then the killed candidate is restarted as a standby and the loop repeats. Every write is
recorded; at the end the checker (``xcecore.testing.checker``) verifies that no acknowledged
write was lost or applied twice and that no candidate acknowledged a write issued after a later
candidate's promotion. Writes ``benchmarks/results/failover.json`` and ``failover.png`` (with
``--fault stop``: ``failover-stop.json`` and ``.png``; with ``--liveness S``, ``-livenessS`` is
added to the name; with ``--auth munge``, ``-munge``; with ``--tls``, ``-tls``). ``--tls``
turns TLS on for every connection to a candidate and HTTPS on REST (a CA and certificates
made for the run). ``--tag T`` adds ``-T`` to the name (a comparison run that must not
replace the figures of section 1). ``--auth munge`` runs the whole cluster with
``[cluster] auth = "munge"`` against a real munged with its own key (every connection,
re-join and reconnect authenticates with a fresh MUNGE credential).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anyio.lowlevel
from benchkit import (
    PARKED_QUEUE,
    RESULTS,
    BenchCluster,
    log,
    log_times,
    meta,
    quiet_logs,
    scratch,
    stats,
    write_result,
)

from xcecore.testing.checker import History, check, promotions_in_logs

PART = "failover"
ROLES = ("node1", "node2", "scheduler", "apiserver")
WRITE_GAP = 0.005
PEERS = [  # BENCHMARKS.md: kill -> first acknowledged write issued after the kill (seconds)
    ("ZooKeeper 3.8, 3 nodes, kazoo (defaults)", 0.75, 0.53, 1.39),
    ("ZooKeeper, kazoo 50 ms retry (tuned)", 0.66, 0.41, 0.84),
    ("etcd 3.4, 3 nodes (election 1 s)", 1.23, 1.22, 1.64),
    ("Redis 7 + Sentinel (down-after 1 s)", 2.27, 2.22, 2.39),
    ("Redis 7 + Sentinel (defaults)", 30.8, 30.8, 31.5),
    ("Slurm 22.05 (SlurmctldTimeout=5)", 6.5, 6.2, 7.1),
    ("Slurm 22.05 (defaults, 120 s)", 141.0, 122.0, 156.0),
]


def _index_of(bc: BenchCluster, address: str) -> int:
    port = int(address.rsplit(":", 1)[1])
    return bc.cluster.ports.index(port)


def _log_rejoins(bc: BenchCluster, t_kill: float) -> dict[str, float | None]:
    """Kill -> first "re-joined as" log line after the kill, per role (seconds; None: not yet)."""
    out: dict[str, float | None] = {}
    for name in ROLES:
        times = [t for t in log_times(bc.roles[name].text(), "re-joined as", t_kill)
                 if t >= t_kill - 0.001]  # log times are truncated to the millisecond
        out[name] = max(0.0, min(times) - t_kill) if times else None
    return out


def _identity_role(identity: str) -> str | None:
    """Which of ROLES a member identity is (``worker@node1`` -> node1)."""
    role, _, host = identity.partition("@")
    if role == "worker":
        return host if host in ROLES else None
    return role if role in ROLES else None


def _status_rejoins(status: dict[str, Any], t_kill: float) -> dict[str, float | None] | None:
    """Kill -> each role's ``joined_at`` on the new primary (its clock); None if not reported."""
    members = status.get("member_list")
    if members is None:
        return None
    out: dict[str, float | None] = dict.fromkeys(ROLES)
    for m in members:
        name = _identity_role(m.get("identity", ""))
        if name is not None and m.get("joined_at", 0) >= t_kill:
            out[name] = m["joined_at"] - t_kill
    return out


HISTORY = History()
BACKEND = ["file"]  # [controller] backend of this run (--backend)


async def _write(client: Any, seq: int) -> tuple[float, float]:
    """One durable submission, recorded: (issued, acknowledged) epoch times."""
    op = HISTORY.invoke("writer", "submit", f"fo-{seq}")
    result = await client.call("jobsubmit", {"command": f"true # {seq}", "queue": PARKED_QUEUE,
                                             "name": f"fo-{seq}"})
    HISTORY.ok(op, result, str(client.candidate))
    assert op.completed is not None
    return op.invoked, op.completed


async def one_kill(bc: BenchCluster, client: Any, rng: random.Random, seq: list[int],
                   fault: str = "kill") -> dict[str, Any]:
    """Steady writes, SIGKILL (or SIGSTOP) the primary with a write in flight, measure,
    restart it."""
    st = await client.call("status")
    old = _index_of(bc, st["primary"])
    victim = bc.cluster.candidates[old]
    steady_until = time.monotonic() + rng.uniform(0.5, 1.5)
    while time.monotonic() < steady_until:
        seq[0] += 1
        await _write(client, seq[0])
        await anyio.sleep(WRITE_GAP)
    inflight: dict[str, float] = {}

    async def in_flight_write() -> None:
        seq[0] += 1
        inflight["issued"], inflight["acked"] = await _write(client, seq[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(in_flight_write)
        for _ in range(100):  # until the request is registered on the link (sent or sending)
            await anyio.lowlevel.checkpoint()
            conn = client._conn
            if conn is not None and conn.pending:
                break
        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    seq[0] += 1
    first_issued, first_acked = await _write(client, seq[0])
    first_server = str(client.candidate)
    st = await client.call("status")
    new = _index_of(bc, st["primary"])
    rejoin: dict[str, float | None] = {}
    source = "status.member_list joined_at"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = _status_rejoins(await client.call("status"), t_kill)
        if found is None:  # a controller without member_list: the roles' own log lines
            source, found = "role logs", _log_rejoins(bc, t_kill)
        rejoin = found
        if all(v is not None for v in rejoin.values()):
            break
        await anyio.sleep(0.02)
    from_logs = _log_rejoins(bc, t_kill)
    # A stopped primary is fenced (SIGKILLed) by the standby that took over (file backend);
    # on etcd its lease expired: it would give the role up on waking; end it here instead.
    if fault == "stop" and BACKEND[0] != "file" and victim.alive():
        victim.kill()
    code = await anyio.to_thread.run_sync(victim.popen.wait, 30)
    t_restart = time.monotonic()
    bc.cluster.start_candidate(old)
    await anyio.to_thread.run_sync(bc.cluster.wait_state, old, "standby", 60.0)
    done = [v for v in rejoin.values() if v is not None]
    return {
        "old": old, "new": new, "jobs": st["jobs"],
        "promotion": st["since"] - t_kill,
        "inflight_ack": inflight["acked"] - t_kill,
        "inflight_issued_before_kill": t_kill - inflight["issued"],
        "first_write": first_acked - t_kill,
        "first_write_issued_after_kill": first_issued - t_kill,
        "rejoin": rejoin,
        "rejoin_source": source,
        "rejoin_from_logs": from_logs,
        "all_rejoined": max(done) if len(done) == len(ROLES) else None,
        "restart_to_standby": time.monotonic() - t_restart,
        "fault": fault,
        "victim_exit": code,
        "first_write_server_is_old": first_server == bc.cluster.address(old),
    }


async def run_kills(bc: BenchCluster, kills: int, seed: int, fault: str = "kill",
                    liveness: float | None = None) -> tuple[list[dict[str, Any]], int, list[Any]]:
    """``kills`` fault cycles with one writer client; the records, the final job count and
    every job (for the checker)."""
    from xcecore.client import Client

    rng = random.Random(seed)
    seq = [0]
    records: list[dict[str, Any]] = []
    cfg = bc.client_config("cli@bench-writer")
    if liveness is not None:
        from xcecore.client import ClientConfig

        cfg = ClientConfig(**{**{k: getattr(cfg, k) for k in ClientConfig.__slots__},
                              "liveness_timeout": liveness})
    async with Client(cfg, role="cli") as client:
        await client.connect()
        for k in range(kills):
            rec = await one_kill(bc, client, rng, seq, fault)
            records.append(rec)
            log(PART, f"kill {k + 1}/{kills}: candidate {rec['old']} -> {rec['new']}; promotion "
                      f"{rec['promotion'] * 1e3:.1f} ms, in-flight ack {rec['inflight_ack'] * 1e3:.1f} ms, "
                      f"first write {rec['first_write'] * 1e3:.1f} ms, all roles re-joined "
                      f"{(rec['all_rejoined'] or float('nan')) * 1e3:.0f} ms")
        jobs = (await client.call("status"))["jobs"]
        everything = []
        args: dict[str, Any] = {"queue": PARKED_QUEUE, "limit": 1000}
        while True:  # the listing is paged
            page = await client.call("jobinfo", args)
            everything += page["jobs"]
            if page["next"] is None:
                break
            args["cursor"] = page["next"]
    return records, jobs, everything


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Distributions (milliseconds) over the kills."""
    def ms(key: str) -> dict[str, float]:
        return stats([r[key] * 1e3 for r in records if r.get(key) is not None], 1)

    per_role = {name: stats([r["rejoin"][name] * 1e3 for r in records
                             if r["rejoin"].get(name) is not None], 1) for name in ROLES}
    pooled = stats([r["rejoin"][n] * 1e3 for r in records for n in ROLES
                    if r["rejoin"].get(n) is not None], 1)
    return {
        "promotion_ms": ms("promotion"),
        "inflight_ack_ms": ms("inflight_ack"),
        "first_write_ms": ms("first_write"),
        "all_rejoined_ms": ms("all_rejoined"),
        "role_rejoin_ms": per_role,
        "role_rejoin_pooled_ms": pooled,
        "rejoin_source": sorted({r.get("rejoin_source", "?") for r in records}),
        "role_rejoin_pooled_from_logs_ms": stats([r["rejoin_from_logs"][n] * 1e3 for r in records for n in ROLES
                                                  if r.get("rejoin_from_logs", {}).get(n) is not None], 1),
        "restart_to_standby_s": stats([r["restart_to_standby"] for r in records], 2),
        # The standby loads the whole state when it promotes; the writer adds jobs every cycle,
        # so the first and last tenth of the kills show how promotion scales with the state.
        "state_growth": _growth(records),
        "missing_rejoins": sum(1 for r in records for n in ROLES if r["rejoin"].get(n) is None),
    }


def _growth(records: list[dict[str, Any]]) -> dict[str, Any]:
    k = max(1, len(records) // 10)
    out = {}
    for name, part in (("first_tenth", records[:k]), ("last_tenth", records[-k:])):
        out[name] = {"kills": len(part), "jobs_median": stats([r.get("jobs", 0) for r in part], 0).get("p50"),
                     "promotion_ms_median": stats([r["promotion"] * 1e3 for r in part], 1).get("p50"),
                     "first_write_ms_median": stats([r["first_write"] * 1e3 for r in part], 1).get("p50")}
    return out


def plot(records: list[dict[str, Any]], path: Path, fault: str = "kill", hung_ms: float = 2000.0) -> bool:
    """ECDF of the per-kill latencies; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = [("promotion", "standby promoted"), ("inflight_ack", "in-flight write acked"),
              ("first_write", "first write after kill acked"), ("all_rejoined", "all 4 roles re-joined")]
    for key, label in series:
        xs = sorted(r[key] * 1e3 for r in records if r.get(key) is not None)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    if fault == "kill":
        ax.axvline(300, color="grey", ls="--", lw=0.8)
        ax.text(290, 0.5, "300 ms: re-join p50 target ", color="grey", fontsize=8, ha="right")
        ax.set_xticks([5, 10, 20, 50, 100, 200, 300, 500, 1000])
    else:
        hung = hung_ms
        ax.axvline(hung + 300, color="grey", ls="--", lw=0.8)
        ax.text(hung + 290, 0.5, "hung_timeout + 300 ms: p50 target ", color="grey", fontsize=8, ha="right")
        ax.set_xticks([20, 50, 100, 200, 500, 1000, 2000, 3000, 5000])
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"milliseconds after SIG{fault.upper()} of the primary (log scale)")
    ax.set_ylabel("fraction of kills")
    ax.set_title(f"xce failover, {len(records)} SIG{fault.upper()}s, 3 candidates + 2 workers + scheduler + API")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


BED_FAULTS = {"poweroff": "power-off-primary-host", "freeze": "freeze-primary-host"}
"""--fault on the fault test bed (etcd backend): the xce_etcd.chaos fault kind of each."""


def run_bed_faults(part: str, fault: str, faults: int, seed: int, keep: bool) -> int:
    """``--backend etcd --fault poweroff|freeze``: ``faults`` of one kind on the fault test bed."""
    from xce_etcd import chaos

    from xcecore.testing.faultbed import FaultBed

    quiet_logs("ERROR")
    load_at_start = round(os.getloadavg()[0], 2)
    with scratch("xce-bench-failover-bed-", part, keep) as sc, FaultBed(sc.path / "bed") as bed:
        root = sc.path
        verdict, recs = chaos.run(bed, root, seed=seed, faults=faults, kinds=[BED_FAULTS[fault]],
                                  settle=True)
        promos = [t for t, _addr in promotions_in_logs(
            sorted((root / "cluster").glob("controller*.log")))]
    records = []
    for r in recs:
        after = [t - r.start for t in promos if t >= r.start]
        records.append({**r.as_dict(), "first_write": r.outage,
                        "promotion": min(after) if after else None,
                        "raft_leader_on_primary_host": r.detail == chaos.RAFT_LEADER_HERE})
    summary = {"first_write_ms": stats([r["first_write"] * 1e3 for r in records
                                        if r["first_write"] is not None], 1),
               "promotion_ms": stats([r["promotion"] * 1e3 for r in records
                                      if r["promotion"] is not None], 1),
               "raft_leader_on_primary_host": sum(r["raft_leader_on_primary_host"] for r in records),
               "recovered": sum(1 for r in records if r["recovered"])}
    write_result(part, {**meta(), "fault": fault, "backend": "etcd", "bed": True, "kills": faults,
                        "seed": seed, "loadavg_1min_at_start": load_at_start,
                        "loadavg_1min_at_end": round(os.getloadavg()[0], 2),
                        "checker": verdict.as_dict(), "summary": summary, "records": records})
    fw, pr = summary["first_write_ms"], summary["promotion_ms"]
    log(part, f"first write p50 {fw.get('p50')} ms p99 {fw.get('p99')}; promotion p50 "
              f"{pr.get('p50')} ms p99 {pr.get('p99')}; raft leader on the primary's host at "
              f"{summary['raft_leader_on_primary_host']} of {len(records)} faults; {verdict.summary()}")
    return 0 if verdict.ok and summary["recovered"] == len(records) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the failover benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50, help="faults of the primary (default 50)")
    ap.add_argument("--quick", action="store_true", help="5 faults")
    ap.add_argument("--fault", choices=("kill", "stop", *BED_FAULTS), default="kill",
                    help="kill: SIGKILL the primary; stop: SIGSTOP it (hung; fenced by a standby); "
                         "poweroff, freeze: the primary's host on the fault test bed (--backend etcd)")
    ap.add_argument("--hung-timeout", type=float, default=2.0, help="[controller] hung_timeout")
    ap.add_argument("--liveness", type=float, default=None,
                    help="the writer's [client] liveness_timeout (default: the cluster's 1.5 s; "
                         "with --backend etcd, the lease TTL, 1 s)")
    ap.add_argument("--auth", choices=("key", "munge"), default="key",
                    help="the cluster's authentication (munge: a real munged, run here)")
    ap.add_argument("--tls", action="store_true",
                    help="TLS on every connection to a candidate ([tls], a CA made here)")
    ap.add_argument("--tag", default=None, help="add -TAG to the results' name")
    ap.add_argument("--backend", choices=("file", "etcd"), default="file",
                    help="[controller] backend (etcd: a three-member etcd on loopback)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs)")
    args = ap.parse_args(argv)
    kills = 5 if args.quick else args.kills
    part = PART if args.fault == "kill" else f"{PART}-{args.fault}"
    if args.liveness is not None:
        part += f"-liveness{args.liveness:g}"
    if args.auth == "munge":
        part += "-munge"
    if args.tls:
        part += "-tls"
    if args.tag:
        part += f"-{args.tag}"
    if args.backend != "file":
        part += f"-{args.backend}"
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    if args.liveness is None and args.backend == "etcd":
        from xce_etcd.testing import CLIENT_LIVENESS

        args.liveness = CLIENT_LIVENESS  # (the bed's clients have it too: MultiHostCluster)
    if args.fault in BED_FAULTS:
        if args.backend != "etcd":
            ap.error(f"--fault {args.fault} needs --backend etcd (the fault test bed's hosts)")
        return run_bed_faults(part, args.fault, kills, seed, args.keep)
    quiet_logs()
    root = Path(tempfile.mkdtemp(prefix="xce-bench-failover-"))
    load_at_start = round(os.getloadavg()[0], 2)
    munged = None
    if args.auth == "munge":
        from xcecore.testing.munge import Munged

        munged = Munged(root / "munge").start()
    etcd = None
    controller, extra = f"hung_timeout = {args.hung_timeout}\n", ""
    if args.backend == "etcd":
        from xce_etcd.testing import EtcdCluster, etcd_config

        etcd = EtcdCluster(root / "etcd", ["127.0.0.1"] * 3, client_port=23400, peer_port=23401)
        etcd.start()
        controller += 'backend = "etcd"\n'
        extra = etcd_config(etcd.endpoints, "/bench")
    bc = BenchCluster(root, api=True, controller=controller, extra=extra,
                      munge_socket=munged.socket if munged else None, tls=args.tls)
    BACKEND[0] = args.backend
    try:
        bc.start()
        bc.start_workers(2)
        bc.start_role("scheduler")
        bc.start_role("apiserver")
        for name in ROLES:
            bc.wait_logged(name, "joined as", 60)
        log(part, f"cluster up in {root}; {kills} x {args.fault}")
        records, jobs, everything = anyio.run(run_kills, bc, kills, seed, args.fault, args.liveness)
        verdict = check(HISTORY.snapshot(), everything, promotions=promotions_in_logs(
            [root / f"{bc.cluster.server_role}{i}.log" for i in range(bc.cluster.ncandidates)]))
    except BaseException:
        print(bc.cluster.logs()[-8000:], file=sys.stderr)
        args.keep = True
        raise
    finally:
        bc.close()
        if munged is not None:
            munged.stop()
        if etcd is not None:
            etcd.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarize(records)
    summary["fenced"] = sum(1 for r in records if r["victim_exit"] == -signal.SIGKILL)
    summary["first_write_from_old_primary"] = sum(1 for r in records if r["first_write_server_is_old"])
    result = {**meta(), "fault": args.fault, "auth": args.auth, "tls": args.tls,
              "backend": args.backend, "kills": kills, "seed": seed,
              "hung_timeout": args.hung_timeout, "write_gap_ms": WRITE_GAP * 1e3,
              "loadavg_1min_at_start": load_at_start,
              "loadavg_1min_at_end": round(os.getloadavg()[0], 2),
              "jobs_in_state_at_end": jobs,
              "client_settings": {"heartbeat_interval": 0.2, "liveness_timeout": 1.5,
                                  "connect_timeout": 0.5, "backoff_base": 0.02, "backoff_cap": 0.5,
                                  "writer_liveness_timeout": args.liveness or 1.5},
              "checker": verdict.as_dict(),
              "summary": summary, "peers_first_write_s": PEERS, "records": records}
    result["plot"] = f"{part}.png" if plot(records, RESULTS / f"{part}.png", args.fault,
                                                      args.hung_timeout * 1e3) else None
    write_result(part, result)
    s = result["summary"]
    log(part, f"first write p50 {s['first_write_ms'].get('p50')} ms p99 {s['first_write_ms'].get('p99')}; "
              f"all roles re-joined p50 {s['all_rejoined_ms'].get('p50')} ms p99 {s['all_rejoined_ms'].get('p99')}; "
              f"{verdict.summary()}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
