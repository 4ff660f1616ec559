"""Prometheus metrics of every role: one exporter per role process, the role says what it measures.

Two kinds of figures, for two costs:

- **Kept as they happen** (counters, histograms: a commit's latency, a scheduling pass's time):
  the role makes them once with ``registry=ctx.metrics`` and updates them where the event
  happens (``Histogram.observe`` is a lock and an add, ~1 µs).
- **Read at a scrape** (gauges of what the role holds: jobs by state, members by role): the
  role's :meth:`xcecore.role.Role.metrics` builds them from counts it already keeps, on the
  event loop, so it reads a consistent state; it never walks the jobs or the hosts (a scrape
  is a request, and no request does work proportional to the cluster on the loop).

The exporter is a small HTTP server on the role's event loop (:func:`serve`: ``GET
/metrics`` only, bounded requests, a few scrapes at a time), started for a role only when
``[metrics] ports`` gives that role a port (off by default; port 0 takes a free one and logs
it; the section is declared in :mod:`xcecore.config`). Names are ``xce_<role>_*`` and
documented in ``docs/operator.md``. The exporter measures its own scrapes in every role
(:class:`ScrapeTimes`, ``xce_metrics_scrape_*``): what a scrape costs the role, measured where
it is spent rather than guessed from the process's CPU ticks.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric


class Histogram:
    """Counts per upper bound, a sum and a count: what a Prometheus histogram exports.

    For a role that keeps its figures without depending on prometheus-client where they
    happen (one ``observe`` is a bisect and two adds; not thread-safe: one writer, or the
    caller's lock); :meth:`family` makes the exported family at a scrape."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs, cumulative, ending with ``+Inf``."""
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], list(self.counts), strict=True):
            running += n
            out.append((bound, float(running)))
        return out

    def family(self, name: str, help: str) -> Metric:
        """This histogram as a Prometheus family (at a scrape)."""
        from prometheus_client.core import HistogramMetricFamily

        fam = HistogramMetricFamily(name, help)
        fam.add_metric([], self.cumulative(), sum_value=self.total)
        return fam


class Measured(Protocol):
    """What the exporter asks at each scrape (a role object)."""

    def metrics(self) -> Iterable[Metric]:
        """The role's gauges now (see :meth:`xcecore.role.Role.metrics`)."""
        ...


class _RoleCollector:
    """Asks the role at each scrape (on the loop); a role whose metrics fail costs that scrape
    its figures, logged once per kind of failure, never the exporter."""

    def __init__(self, who: str, role: Measured) -> None:
        self.who = who
        self.role = role
        self._said: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        try:
            found = list(self.role.metrics())
        except Exception as exc:
            kind = type(exc).__name__
            if kind not in self._said:
                self._said.add(kind)
                logger.opt(exception=True).warning("{}: its metrics failed ({}); this scrape "
                                                   "has none of the role's own figures", self.who, exc)
            return
        yield from found


class _Process:
    """The process's CPU, memory, start time and fd limit from one read of ``/proc/self/stat``.

    Not prometheus-client's ``ProcessCollector``: its ``process_open_fds`` lists
    ``/proc/self/fd``, one entry per connection, so a scrape of a controller with 10,000
    hosts did work proportional to the hosts on the loop."""

    def __init__(self) -> None:
        import os
        import resource

        self._tick = float(os.sysconf("SC_CLK_TCK"))
        self._page = float(os.sysconf("SC_PAGE_SIZE"))
        self._max_fds = float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        with open("/proc/stat", "rb") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith(b"btime"))
        self._boot = boot

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            with open("/proc/self/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            return
        # fields[0] is the state (field 3 of proc(5)): utime is field 14, i.e. fields[11]
        cpu = CounterMetricFamily("process_cpu_seconds", "user and system CPU time (s)")
        cpu.add_metric([], (float(fields[11]) + float(fields[12])) / self._tick)
        yield cpu
        for name, value, what in (
                ("process_virtual_memory_bytes", float(fields[20]), "virtual memory size"),
                ("process_resident_memory_bytes", float(fields[21]) * self._page, "resident memory size"),
                ("process_start_time_seconds", self._boot + float(fields[19]) / self._tick,
                 "start time (Unix time)"),
                ("process_max_fds", self._max_fds, "open file descriptors allowed")):
            g = GaugeMetricFamily(name, what)
            g.add_metric([], value)
            yield g


def new_registry() -> CollectorRegistry:
    """A registry of one role process: its own metrics and the process's (CPU, memory)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    with contextlib.suppress(OSError):  # no /proc: no process figures
        registry.register(_Process())  # type: ignore[arg-type]  # duck-typed Collector
    return registry


SCRAPE_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
"""Seconds a scrape's parts took (the aim, issue #25: under 5 ms at 10,000 hosts)."""


class ScrapeTimes:
    """What the exporter's own scrapes cost, measured inside the role (a collector).

    ``build``: building the reply (every collector and the text), wall time; ``build_cpu``:
    the CPU the event loop's thread spent on it (``time.thread_time``: the role's own cost,
    not other processes' or threads' that ran meanwhile); ``served``: from the connection
    accepted to the reply handed to the kernel (the request read and the send too: the time
    the loop kept the scraper waiting once it took the connection). A scrape exports the
    figures of the scrapes before it: its own are measured while it is built."""

    def __init__(self) -> None:
        self.build = Histogram(SCRAPE_BUCKETS)
        self.build_cpu = Histogram(SCRAPE_BUCKETS)
        self.served = Histogram(SCRAPE_BUCKETS)
        self.last: tuple[float, float, float] | None = None  # build, build_cpu, served

    def observe(self, build: float, build_cpu: float, served: float) -> None:
        """One scrape answered (on the loop)."""
        self.build.observe(build)
        self.build_cpu.observe(build_cpu)
        self.served.observe(served)
        self.last = (build, build_cpu, served)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        yield self.build.family("xce_metrics_scrape_seconds", "building a /metrics reply, "
                                "wall time (previous scrapes)")
        yield self.build_cpu.family("xce_metrics_scrape_cpu_seconds", "building a /metrics "
                                    "reply, CPU of the role's event-loop thread (previous "
                                    "scrapes)")
        yield self.served.family("xce_metrics_scrape_served_seconds", "a scrape from its "
                                 "connection accepted to its reply sent (previous scrapes)")
        if self.last is not None:
            last = GaugeMetricFamily("xce_metrics_last_scrape_seconds", "the previous scrape's "
                                     "parts: build (wall), build_cpu, served", labels=["part"])
            for part, value in zip(("build", "build_cpu", "served"), self.last, strict=True):
                last.add_metric([part], value)
            yield last


MAX_REQUEST = 8192
"""Bytes of request line and headers a scrape may send (a longer one is answered 431)."""
READ_TIMEOUT = 5.0
"""Seconds a scraper may take to send its request."""
MAX_SCRAPES = 4
"""Scrapes answered at once; more wait (a scraper cannot make the role do more than this)."""


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


def answer(request: bytes, registry: CollectorRegistry) -> bytes:
    """The whole HTTP response to one request's head (pure but for the collection, which
    is what :class:`ScrapeTimes` ``build`` measures)."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    line = request.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _response("400 Bad Request", b"not an HTTP request line\n")
    method, target = parts[0], parts[1]
    if target.split("?", 1)[0] != "/metrics":
        return _response("404 Not Found", b"only /metrics is served here\n")
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", b"GET /metrics\n")
    body = generate_latest(registry)
    full = _response("200 OK", body, CONTENT_TYPE_LATEST)
    return full[:len(full) - len(body)] if method == "HEAD" else full


async def _scrape(stream: Any, registry: CollectorRegistry, limiter: Any,
                  times: ScrapeTimes) -> None:
    import anyio
    import anyio.abc

    accepted = time.perf_counter()
    async with stream:
        try:
            data = b""
            with anyio.fail_after(READ_TIMEOUT):
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive(4096)
                    data += chunk
                    if len(data) > MAX_REQUEST:
                        await stream.send(_response("431 Request Header Fields Too Large", b""))
                        return
            async with limiter:
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                reply = answer(data, registry)
                build_cpu, built = time.thread_time() - cpu0, time.perf_counter()
                await stream.send(reply)
                if reply.startswith(b"HTTP/1.1 200"):  # a scrape, not a refused request
                    times.observe(built - wall0, build_cpu, time.perf_counter() - accepted)
        except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return  # a scraper that went away or stalled: nothing to answer


async def serve(who: str, registry: CollectorRegistry, host: str, port: int, *,
                task_status: Any) -> None:
    """Serve ``/metrics`` on the role's event loop until cancelled; ``task_status.started``
    gets the bound port.

    On the loop rather than a thread on purpose: an exporter thread has to win the GIL from a
    busy loop for every step of every request (measured here: 36 ms per scrape of a controller
    with 1,000 hosts), while a scrape on the loop costs what it computes -- the roles'
    :meth:`metrics` read counts they keep, never walk jobs or hosts.
    """
    import anyio
    import anyio.abc

    try:
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    logger.info("{}: metrics on http://{}:{}/metrics", who, _bracket(host), bound)
    limiter = anyio.CapacityLimiter(MAX_SCRAPES)
    times = ScrapeTimes()
    registry.register(times)  # type: ignore[arg-type]  # duck-typed Collector
    try:
        async with listener:
            task_status.started(bound)
            await listener.serve(lambda stream: _scrape(stream, registry, limiter, times))
    finally:
        registry.unregister(times)  # type: ignore[arg-type]


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def exporter_port(section: dict[str, Any], role_name: str) -> int | None:
    """The port ``[metrics] ports`` gives ``role_name`` (None: no exporter)."""
    port = (section.get("ports") or {}).get(role_name)
    return None if port is None else int(port)


async def run(who: str, role_name: str, section: dict[str, Any], registry: CollectorRegistry,
              role: Measured, *, task_status: Any) -> None:
    """The role's exporter when ``[metrics] ports`` names it (else it returns at once).

    A port in use is a clear error naming the role and the port (the role does not start:
    an operator who asked for metrics must not get a role that silently has none)."""
    port = exporter_port(section, role_name)
    if port is None:
        task_status.started(None)
        return
    registry.register(_RoleCollector(who, role))  # type: ignore[arg-type]  # duck-typed Collector
    host = section.get("host") or "127.0.0.1"
    try:
        await serve(who, registry, host, port, task_status=task_status)
    except OSError as exc:
        raise OSError(f"metrics.ports.{role_name} = {port}: {exc}") from None
