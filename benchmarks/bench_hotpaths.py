"""Hot paths: the post-call check, a pluggy hook call, resource-requirement select at 10,000 hosts.

Run from the repository root::

    python benchmarks/bench_hotpaths.py [--quick]

- post-call path with no rejoin pending: the exact expression ``Client.call`` evaluates after
  every reply (``self.rejoin_pending and op in self.rejoin_points``), on a real ``Client``;
  also the ``Client.rejoin_due(op)`` method for comparison. Net of an empty loop.
- a pluggy hook call with one implementation: ``xce_reconnected`` on a plugin manager holding
  the xce hook specs and only the built-in ``rejoin`` plugin (what every reconnect runs).
- the controller's validation edge per request: ``wire.parse_request`` (envelope and the
  generic bound) plus ``ops.check_call`` (role, join, the op's typed schema) for a worker's
  ``heartbeat`` (the hottest op: about 25-30 µs of controller CPU in all), an
  ``update_resvals`` and a ``jobsubmit`` with an environment, as decoded from their frames.
- resource-requirement select over 10,000 synthetic hosts with the evaluator the plugin
  manager provides (``pm.resreq_evaluator(registry).select``), a select-only requirement and a
  typical select + order + rusage one.

Repeated trials; median, p90, min. Writes ``benchmarks/results/hotpaths.json``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import log, meta, stats, write_result

PART = "hotpaths"
SITE: list[dict[str, Any]] = [{"name": "gpu", "type": "bool"}, {"name": "rack", "type": "string"},
        {"name": "ngpus", "type": "numeric", "consumable": True}]
SELECT_ONLY = "select[type==X86_64 && mem>4G && ncpus>=8 && r1m<0.5 && gpu]"
TYPICAL = "select[type==X86_64 && mem>4G && ncpus>=8 && r1m<0.5 && gpu] order[r1m:-mem] rusage[mem=2048]"


def per_call(fn: Callable[[int], None], inner: int, repeat: int) -> list[float]:
    """Seconds per iteration of ``fn(inner)`` (which loops ``inner`` times), per trial."""
    fn(inner // 10)  # warm up
    out = []
    gc.disable()  # collector pauses are noise here, not part of the code under test
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(inner)
            out.append((time.perf_counter() - t0) / inner)
    finally:
        gc.enable()
    return out


def post_call(quick: bool) -> dict[str, Any]:
    """Nanoseconds of the post-call check with nothing pending, net of the empty loop."""
    from xcecore.candidates import Candidate
    from xcecore.client import Client, ClientConfig

    client = Client(ClientConfig(candidates=(Candidate("127.0.0.1", 7600),), sender="cli@bench"),
                    role="worker", rejoin_points=("hello", "notify_job", "update_resvals"))
    op = "jobsubmit"
    inner, repeat = (200_000, 7) if quick else (1_000_000, 15)

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def inline(n: int) -> None:
        c = client
        for _ in range(n):
            if c._rejoin.pending and op in c.rejoin_points:  # the exact tail of Client.call
                pass

    def method(n: int) -> None:
        due = client.rejoin_due
        for _ in range(n):
            due(op)

    base = per_call(empty, inner, repeat)
    res: dict[str, Any] = {}
    for name, fn in (("inline_check", inline), ("rejoin_due_method", method)):
        raw = per_call(fn, inner, repeat)
        floor = min(base)
        res[name] = {"ns_net": stats([(x - floor) * 1e9 for x in raw], 1),
                     "ns_raw": stats([x * 1e9 for x in raw], 1)}
    res["empty_loop_ns"] = stats([x * 1e9 for x in base], 1)
    return res


def hook_call(quick: bool) -> dict[str, Any]:
    """Microseconds of one ``xce_reconnected`` call with one implementation."""
    import importlib

    from xcecore.plugins import BUILTINS, PluginManager

    pm = PluginManager()
    pm.register(importlib.import_module(BUILTINS["rejoin"]), "rejoin")
    impls = len(pm.pm.hook.xce_reconnected.get_hookimpls())

    class Dummy:
        rejoin_pending = False

        def mark_rejoin_pending(self) -> None:
            self.rejoin_pending = True

    dummy = Dummy()
    hook = pm.pm.hook.xce_reconnected
    inner, repeat = (20_000, 7) if quick else (100_000, 15)

    def call(n: int) -> None:
        for _ in range(n):
            hook(client=dummy, candidate=None)

    def facade(n: int) -> None:
        for _ in range(n):
            pm.reconnected(dummy, None)  # type: ignore[arg-type]

    return {"implementations": impls,
            "pluggy_hook_us": stats([x * 1e6 for x in per_call(call, inner, repeat)], 3),
            "plugin_manager_facade_us": stats([x * 1e6 for x in per_call(facade, inner, repeat)], 3)}


def make_hosts(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` synthetic hosts as the evaluator sees them (5% lack load values, 2% unavail)."""
    rnd = random.Random(seed)
    hosts = []
    for i in range(n):
        h: dict[str, Any] = {
            "hname": f"node{i:06d}", "status": "ok" if rnd.random() > 0.02 else "unavail",
            "type": rnd.choice(["X86_64", "X86_64", "X86_64", "ARM64"]),
            "model": rnd.choice(["XeonE5", "Epyc", "Graviton"]),
            "ncpus": rnd.choice([4, 8, 16, 32, 64]), "maxmem": rnd.choice([16384, 65536, 262144]),
            "rack": f"r{rnd.randrange(40)}",
        }
        if rnd.random() > 0.05:
            h.update(mem=rnd.random() * h["maxmem"], r1m=rnd.random() * 2, ut=rnd.random(),
                     slots=rnd.randrange(0, h["ncpus"] + 1))
        if rnd.random() < 0.5:
            h["gpu"] = True
            h["ngpus"] = rnd.randrange(0, 9)
        hosts.append(h)
    return hosts


def resreq_select(quick: bool) -> dict[str, Any]:
    """Milliseconds of ``select`` over 10,000 hosts (compiled once, cached)."""
    from xcecore.plugins import PluginManager
    from xcecore.resreq.registry import ResourceRegistry

    evaluator = PluginManager.load().resreq_evaluator(ResourceRegistry(SITE))
    hosts = make_hosts(10_000)
    repeat = 9 if quick else 31
    out: dict[str, Any] = {"hosts": len(hosts), "evaluator": type(evaluator).__module__ + "." +
                           type(evaluator).__name__}
    for name, text in (("select_only", SELECT_ONLY), ("select_order_rusage", TYPICAL)):
        matched = len(evaluator.select(text, hosts))

        def run(n: int, text: str = text) -> None:
            for _ in range(n):
                evaluator.select(text, hosts)

        out[name] = {"text": text, "matched": matched,
                     "ms": stats([x * 1e3 for x in per_call(run, 1, repeat)], 3)}
    return out


def controller_edge(quick: bool) -> dict[str, Any]:
    """Microseconds of ``parse_request`` + ``check_call`` per request, by op."""
    import orjson
    from xce_controller.authz import Policy
    from xce_controller.ops import Caller, check_call
    from xce_controller.settings import DEFAULT_QUEUES
    from xce_controller.state import ClusterConf, ClusterState

    from xcecore import wire
    from xcecore.auth import Identity

    state = ClusterState(ClusterConf(queues=DEFAULT_QUEUES))
    policy = Policy(owner="bench")
    worker = Caller("worker@n1", "worker", Identity(0, 0, "root", "worker", "n1", "key"),
                    joined=True, worker_host="n1")
    cli = Caller("cli@bench", "cli", Identity(1000, 1000, "bench", "cli", "bench", "key"))
    cases = {
        "heartbeat": (worker, {}),
        "update_resvals": (worker, {"values": {k: 0.5 for k in ("r15s", "r1m", "r15m", "ut", "pg", "io",
                                                                  "ls", "it", "tmp", "swp", "mem")}}),
        "jobsubmit": (cli, {"command": "sleep 1", "queue": "normal", "ntasks": 2,
                            "env": {f"V{i}": "x" * 20 for i in range(10)}, "resreq": "select[mem>1G]"}),
    }
    inner, repeat = (5_000, 9) if quick else (50_000, 15)
    out: dict[str, Any] = {}
    for op, (caller, args) in cases.items():
        msg = orjson.loads(orjson.dumps(wire.request(7, op, args, "rid-1")))

        def run(n: int, msg: dict[str, Any] = msg, caller: Caller = caller) -> None:
            for _ in range(n):
                req = wire.parse_request(msg)
                check_call(req.op, caller, req.args, state, policy)

        out[op] = {"us": stats([x * 1e6 for x in per_call(run, inner, repeat)], 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the hot-path benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    args = ap.parse_args(argv)
    result = {**meta(), "post_call": post_call(args.quick), "hook_call": hook_call(args.quick),
              "resreq_select_10000": resreq_select(args.quick),
              "controller_edge": controller_edge(args.quick),
              "reference": {"pluggy_hook_us": "about 4 (BENCHMARKS.md)",
                            "select_10000_ms": "3-5 generated code, 8-30 closure tree, "
                                               "64-155 AST walker (BENCHMARKS.md)"}}
    write_result(PART, result)
    pc, hk, rq = result["post_call"], result["hook_call"], result["resreq_select_10000"]
    log(PART, f"post-call check {pc['inline_check']['ns_net']['p50']} ns net; hook "
              f"{hk['pluggy_hook_us']['p50']} us; select 10k hosts "
              f"{rq['select_only']['ms']['p50']} ms (typical {rq['select_order_rusage']['ms']['p50']} ms); "
              f"edge heartbeat {result['controller_edge']['heartbeat']['us']['p50']} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
