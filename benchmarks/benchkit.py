"""Shared helpers of the scale benchmarks: statistics, result files, a whole cluster.

Everything here drives real processes on loopback (``LocalCluster``); nothing is mocked.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import resource
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_USER = "bench"
BENCH_PASSWORD = "bench-password-1"
# Jobs the failover/throughput writers submit go to this inactive queue: the controller stores
# them durably like any job, but nothing dispatches them, so the writers do not load the cluster.
PARKED_QUEUE = "parked"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: Iterable[float], digits: int = 3) -> dict[str, float]:
    """n, min, p50 (= median), p90, p99, max and mean of ``values``, rounded."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"n": 0}
    out = {"n": len(xs), "min": min(xs), "p50": percentile(xs, 50), "median": percentile(xs, 50),
           "p90": percentile(xs, 90), "p99": percentile(xs, 99), "max": max(xs),
           "mean": sum(xs) / len(xs)}
    return {k: (v if k == "n" else round(v, digits)) for k, v in out.items()}


MS, US = 1e3, 1e6  # the unit of :func:`timed`'s figures: milliseconds, microseconds


def timed(fn: Callable[[], Any], runs: int, *, unit: float = MS, warmup: int = 0,
          digits: int = 3) -> dict[str, float]:
    """:func:`stats` of ``runs`` calls of ``fn``, each timed alone, in ``unit`` (:data:`MS`
    or :data:`US`), after ``warmup`` calls that are not timed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * unit)
    return stats(times, digits)


def command_line() -> str:
    """How this benchmark was started, as a shell line relative to the repository root."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).is_absolute():
        try:
            argv[0] = str(Path(argv[0]).relative_to(ROOT))
        except ValueError:
            pass
    return "python " + " ".join(shlex.quote(a) for a in argv)


def meta(command: str | None = None) -> dict[str, Any]:
    """Date, core count, platform, Python version and the command, for every result file."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "command": command or command_line(),
    }


def write_result(part: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<part>.json`` (with metadata) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{part}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    print(f"[{part}] wrote {path.relative_to(ROOT)}", flush=True)
    return path


def raise_fd_limit(want: int = 1 << 20) -> int:
    """Raise this process's soft open-file limit as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(want, hard) if hard != resource.RLIM_INFINITY else want
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def log(part: str, msg: str) -> None:
    """One progress line on stdout."""
    print(f"[{part} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Scratch:
    """A benchmark run's temporary directory (``path``); set ``keep`` to keep it at the end."""

    def __init__(self, path: Path, keep: bool) -> None:
        self.path = path
        self.keep = keep


@contextmanager
def scratch(prefix: str, part: str, keep: bool = False, label: str = "") -> Iterator[Scratch]:
    """A fresh temporary directory for one run, removed at the end unless asked to keep it
    (``keep``, or ``Scratch.keep`` set during the run, e.g. on a checker violation) or the run
    raised: then it is kept for the post-mortem, and the kept path is logged."""
    sc = Scratch(Path(tempfile.mkdtemp(prefix=prefix)), keep)
    try:
        yield sc
    except BaseException:
        sc.keep = True
        raise
    finally:
        if sc.keep:
            log(part, f"{label}kept {sc.path}")
        else:
            shutil.rmtree(sc.path, ignore_errors=True)


def cluster_extra(root: Path, *, api: bool, failover_grace: float | None = None,
                  host_timeout: float = 60.0, extra: str = "", hash_iterations: int | None = None,
                  controller: str = "") -> str:
    """Config for the controller, scheduler and API server of a benchmark cluster
    (``controller``: more lines of the [controller] table)."""
    text = (
        f'[controller]\nadmins = ["{BENCH_USER}", "admin"]\nhost_timeout = {host_timeout}\n{controller}'
        'queues = [{ name = "normal", priority = 30 }, { name = "priority", priority = 43 },'
        f' {{ name = "{PARKED_QUEUE}", priority = 10, active = false }}]\n'
        f'[scheduler]\nstatus_file = "{root / "scheduler.status"}"\n'
    )
    if api:
        from xce_apiserver.auth import hash_password

        pw = hash_password(BENCH_PASSWORD, **({"iterations": hash_iterations} if hash_iterations else {}))
        grace = "" if failover_grace is None else f"failover_grace = {failover_grace}\n"
        text += (
            f'[apiserver]\nlisten = "127.0.0.1:0"\nport_file = "{root / "api.port"}"\n{grace}'
            f'users = [{{ name = "{BENCH_USER}", password_hash = "{pw}", role = "admin" }}]\n'
        )
    return text + extra


class BenchCluster:
    """Controller candidates plus (optionally) workers, the scheduler and the API server."""

    def __init__(self, root: Path, *, candidates: int = 3, extra: str = "", api: bool = False,
                 failover_grace: float | None = None, host_timeout: float = 60.0, cluster: str = "",
                 hash_iterations: int | None = None, controller: str = "",
                 munge_socket: str | None = None, tls: bool = False) -> None:
        from xcecore.testing.cluster import DEFAULT_KEY, LocalCluster

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # ``cluster``: extra lines of the [cluster] table (e.g. event_loop = "asyncio")
        # ``munge_socket``: authenticate with MUNGE through that munged (no cluster key)
        # ``tls``: TLS on every connection to a candidate, HTTPS on REST (a CA made here)
        self.cluster = LocalCluster(
            root, candidates, None if munge_socket else DEFAULT_KEY, cluster_extra=cluster,
            extra_config=cluster_extra(
                root, api=api, failover_grace=failover_grace, host_timeout=host_timeout, extra=extra,
                hash_iterations=hash_iterations, controller=controller),
            auth="munge" if munge_socket else "key", munge_socket=munge_socket, tls=tls)
        self.roles: dict[str, Any] = {}
        # A MUNGE cluster is multi-user: its workers run jobs as their submitters.
        self.worker_extra = ("worker.run_as_user=true",) if munge_socket else ()

    def start(self) -> None:
        """Start the candidates (candidate 0 primary, the others standbys)."""
        self.cluster.start(60)

    def start_workers(self, n: int, slots: int = 4) -> None:
        """Start ``n`` real worker processes posing as hosts node1..nodeN."""
        for i in range(1, n + 1):
            name = f"node{i}"
            (self.root / name).mkdir(exist_ok=True)
            self.roles[name] = self.cluster.start_role(
                "worker", f'worker.hname="{name}"', f'worker.state_dir="{self.root / name}"',
                f"worker.slots={slots}", f"worker.ncpus={slots}", *self.worker_extra, name=name)

    def start_role(self, role: str, *overrides: str) -> None:
        """Start a role (the scheduler, the API server, accounting...), with ``--set`` overrides."""
        self.roles[role] = self.cluster.start_role(role, *overrides)

    def client_config(self, sender: str) -> Any:
        """A ``ClientConfig`` for a benchmark client of this cluster."""
        from xcecore.runtime import client_config, load

        _, config = load(self.cluster.config_path)
        return client_config(config, sender)

    def api_url(self, timeout: float = 30.0) -> str:
        """The API server's base URL, once it has written its port file."""
        port_file = self.root / "api.port"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                return f"http://127.0.0.1:{port_file.read_text().strip()}/xce/v1"
            time.sleep(0.05)
        raise TimeoutError(f"API server wrote no port file in {timeout} s\n{self.cluster.logs()}")

    def wait_logged(self, name: str, text: str, timeout: float = 30.0) -> None:
        """Wait until role ``name``'s log contains ``text``."""
        deadline = time.monotonic() + timeout
        while text not in self.roles[name].text():
            if time.monotonic() > deadline or not self.roles[name].alive():
                raise TimeoutError(f"{name} never logged {text!r}:\n{self.roles[name].text()[-3000:]}")
            time.sleep(0.05)

    def close(self) -> None:
        """Kill every process (by pid), then remove the job cgroups its workers listed in
        their state dirs (a SIGKILLed worker cannot remove its own; the test suite's
        conftest does the same for tests)."""
        self.cluster.close()
        from xce_worker.containment import remove_listed

        remove_listed(self.root, depth=1)


def logon(url: str) -> str:
    """Log on to the API server as the benchmark user; the bearer token."""
    import httpx

    r = httpx.post(f"{url}/auth/logon", json={"username": BENCH_USER, "password": BENCH_PASSWORD},
                   timeout=10)
    r.raise_for_status()
    return str(r.json()["data"]["token"])


def log_times(text: str, needle: str, near: float) -> list[float]:
    """Epoch times of the log lines containing ``needle`` (loguru ``HH:MM:SS.mmm`` prefix).

    The log has no date: each time is put on the day that brings it closest to ``near``.
    """
    out = []
    for line in text.splitlines():
        if needle in line and len(line) > 29 and line[10] == "T" and line[19] == ".":
            try:  # the ISO 8601 prefix of xcecore's log lines: a whole date, time and offset
                out.append(dt.datetime.fromisoformat(line[:29]).timestamp())
            except ValueError:
                pass
            continue
        if needle not in line or len(line) < 12 or line[2] != ":" or line[8] != ".":
            continue
        try:
            hh, mm, ss = int(line[0:2]), int(line[3:5]), float(line[6:12])
        except ValueError:
            continue
        base = dt.datetime.fromtimestamp(near).replace(hour=hh, minute=mm, second=0, microsecond=0)
        t = base.timestamp() + ss
        for shift in (-86400.0, 86400.0):
            if abs(t + shift - near) < abs(t - near):
                t += shift
        out.append(t)
    return out


def quiet_logs(level: str = "ERROR") -> None:
    """Keep the client library's per-event log lines out of the benchmark's own output.

    Also turns SIGTERM into ``SystemExit`` so a stopped benchmark still runs its cleanup
    (killing, by pid, every process it started).
    """
    import signal

    from loguru import logger

    def _term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    logger.remove()
    logger.add(sys.stderr, level=level)


class JobWatcher:
    """Client hooks of an observer joined as a third-party role: when each job changed state.

    A third-party role receives every push (protocol-ops.md): the state sync's records after
    each join, then the changes; ``seen[jobid][state]`` is the epoch time the first push
    showing the job in ``state`` arrived.
    """

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, float]] = {}
        self.records: dict[int, dict[str, Any]] = {}

    def reconnected(self, client: Any, candidate: Any) -> None:
        """Re-join at the next rejoin point, like the built-in plugin."""
        client.mark_rejoin_pending()

    def connection_state(self, client: Any, state: str, candidate: Any, detail: str) -> None:
        """Not needed here."""

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> None:
        """Record job state changes."""
        now = time.time()
        if event == "job":
            self._job(data, now)
        elif event == "sync_records" and data.get("kind") == "jobs":
            for job in data.get("items", []):
                self._job(job, now)

    def _job(self, job: dict[str, Any], now: float) -> None:
        jid = job["jobid"]
        self.records[jid] = job
        self.seen.setdefault(jid, {}).setdefault(job["state"], now)
