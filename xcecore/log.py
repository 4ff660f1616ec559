"""One logging setup for every role: loguru to stderr (and a file), the component in every line.

- Every line starts with the date, time and time zone (ISO 8601, milliseconds, UTC offset).
- ``json``: one flat JSON object per line (:func:`json_line`), not loguru's nested record.
- ``file``: also to a file, rotated by size or age (``rotation``) with old files removed by
  count or age (``retention``); loguru's own syntax ("100 MB", "1 day", "10 days", 10).
- The standard library's ``logging`` (uvicorn, httpx, any library) goes through the same
  sinks and format (:class:`_ToLoguru`).
- Repeated lines are summarized (:class:`RepeatSummarizer`): during an outage each call site
  of each component logs at most one line per ``repeat_interval`` and then a count.

Importing this module is cheap (loguru is imported when logging is set up): one-shot CLI
commands use :func:`stamp` without loading loguru.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging
    from pathlib import Path

    from loguru import Record

TIME_FORMAT = "YYYY-MM-DDTHH:mm:ss.SSSZ"  # loguru's tokens for ISO 8601 with the UTC offset
_FORMAT = (
    "<green>{time:" + TIME_FORMAT + "}</green> <level>{level: <7}</level> "
    "<cyan>{extra[component]}</cyan> | {message}"
)
DEFAULT_ROTATION = "100 MB"
DEFAULT_RETENTION = 10  # rotated files kept
DEFAULT_REPEAT_INTERVAL = 10.0
REPEAT_LEVEL = 30  # WARNING: lines below are distinct events (a job started) and never merged
_DIGITS = re.compile(r"\d+")


def stamp(now: float | None = None) -> str:
    """``now`` (default: the current time) as local ISO 8601 with milliseconds and offset."""
    t = datetime.fromtimestamp(time.time() if now is None else now).astimezone()
    return t.isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------- repeats
class _Window:
    """One event's current interval: when it began and what was suppressed in it."""

    __slots__ = ("count", "extra", "level", "message", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.count = 0  # lines suppressed since ``started``
        self.level = ""
        self.message = ""
        self.extra: dict[str, Any] = {}


class RepeatSummarizer:
    """Merge repeats of one event: the first line passes, the next ones in ``interval`` are
    counted, and one line per interval says how many there were.

    An event is a message template of one component: its call site (module, function, line)
    and its text with every number masked (addresses, ports, counts, ids differ between
    repeats; the words do not); only WARNING and above are merged. Installed as loguru's patcher, so it decides once per
    record for every sink. A flush thread writes the count of a window that ended without a
    further occurrence (the outage ended), so no count is lost. The table is bounded by
    ``max_keys`` (call sites are few; an excess is forgotten oldest first).
    """

    def __init__(self, interval: float, emit: Callable[[str, str, dict[str, Any]], None],
                 max_keys: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._emit = emit
        self._max = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple[Any, ...], _Window] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, record: Record) -> None:
        """loguru patcher: mark the record dropped, or append the count of its repeats."""
        extra = record["extra"]
        if record["level"].no < REPEAT_LEVEL or extra.get("_summary"):
            return
        # The template: the call site, and the message with its numbers masked (one call
        # site may log many messages: a client's state machine hands all its lines to one).
        key = (extra.get("component"), record["name"], record["function"], record["line"],
               _DIGITS.sub("#", record["message"]))
        now = self._clock()
        with self._lock:
            w = self._windows.get(key)
            if w is None:
                if len(self._windows) >= self._max:
                    self._windows.pop(next(iter(self._windows)))
                self._windows[key] = _Window(now)
                return
            if now - w.started < self.interval:
                w.count += 1
                w.level, w.message, w.extra = record["level"].name, record["message"], dict(extra)
                extra["_drop"] = True
                return
            count, span = w.count, now - w.started
            self._windows[key] = _Window(now)
        if count:
            record["message"] += f" (repeated {count} times in the last {span:.0f} s)"
            extra["repeated"] = count

    def flush(self, everything: bool = False) -> None:
        """Write the count of every window that ended (``everything``: of every window) with
        repeats not yet reported."""
        now = self._clock()
        due: list[tuple[_Window, float]] = []
        with self._lock:
            for key, w in list(self._windows.items()):
                if now - w.started < self.interval and not everything:
                    continue
                if w.count:  # still repeating: the count is this interval's one line
                    due.append((w, now - w.started))
                    self._windows[key] = _Window(now)
                else:  # quiet for a whole interval: its next occurrence is shown at once
                    del self._windows[key]
        for w, span in due:
            extra = {k: v for k, v in w.extra.items() if not k.startswith("_")}
            self._emit(w.level, f"{w.message} (repeated {w.count} times in the last {span:.0f} s)",
                       {**extra, "repeated": w.count, "_summary": True})

    def start(self) -> None:
        """Flush every ``interval`` on a daemon thread until :meth:`close`."""
        def loop() -> None:
            while not self._stop.wait(self.interval / 2):
                self.flush()

        self._thread = threading.Thread(target=loop, daemon=True, name="xce-log-repeats")
        self._thread.start()

    def close(self) -> None:
        """Stop the flush thread (the counts still open are written first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.flush(everything=True)


def _not_dropped(record: Record) -> bool:
    return not record["extra"].get("_drop")


# ---------------------------------------------------------------------- JSON lines
def json_line(record: Record) -> str:
    """One flat JSON object: time, level, component, role and host (from ``role@host``),
    message, the module that logged it, every bound extra field, and the exception if any."""
    import json
    import traceback

    extra = record["extra"]
    component = str(extra.get("component", ""))
    role, at, host = component.partition("@")
    obj: dict[str, Any] = {
        "time": record["time"].isoformat(timespec="milliseconds"),
        "level": record["level"].name,
        "component": component,
    }
    if at:
        obj["role"], obj["host"] = role, host
    obj["message"] = record["message"]
    obj["logger"] = record["name"]
    for k, v in extra.items():
        if k != "component" and not k.startswith("_"):
            obj.setdefault(k, v)
    exc = record["exception"]
    if exc is not None and exc.type is not None:
        obj["exception"] = "".join(traceback.format_exception(exc.type, exc.value, exc.traceback))
    return json.dumps(obj, ensure_ascii=False, default=str)


def _json_format(record: Record) -> str:
    record["extra"]["_json"] = json_line(record)
    return "{extra[_json]}\n"


# ---------------------------------------------------------------------- stdlib logging
def _stdlib_handler() -> logging.Handler:
    """A ``logging`` handler that hands every record to loguru, at its level, from its caller
    (made on demand: one-shot commands never import ``logging``)."""
    import logging

    from loguru import logger

    class ToLoguru(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                level: str | int = logger.level(record.levelname).name
            except ValueError:
                level = record.levelno
            frame: Any = logging.currentframe()
            depth = 0
            while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
                frame, depth = frame.f_back, depth + 1
            logger.opt(depth=depth, exception=record.exc_info).bind(logger=record.name).log(
                level, record.getMessage())

    return ToLoguru()


# ---------------------------------------------------------------------- setup
_summarizer: RepeatSummarizer | None = None
_extra: dict[str, Any] = {}  # fields on every line of this process (component, candidate...)


def bind_fields(**fields: Any) -> None:
    """Add ``fields`` to every later line of this process (a JSON line's keys): e.g. a
    controller candidate's ``candidate`` address once it knows it."""
    from loguru import logger

    _extra.update(fields)
    logger.configure(extra=dict(_extra))


def setup_logging(
    component: str = "xce", level: str = "INFO", *, json: bool = False, file: str | None = None,
    rotation: str | int | None = DEFAULT_ROTATION, retention: str | int | None = DEFAULT_RETENTION,
    repeat_interval: float = DEFAULT_REPEAT_INTERVAL,
) -> None:
    """Send logs to stderr (and ``file``) at ``level``, tagged with ``component`` (role@host).

    ``json`` writes one flat JSON object per line for log shippers. ``file`` is rotated at
    ``rotation`` (a size such as "100 MB", an age such as "1 day", or a time "00:00"), keeping
    ``retention`` old files (a count, or an age such as "2 weeks"); None: never. Repeats of a
    WARNING or worse from one call site are merged over ``repeat_interval`` s (0: never).
    The standard library's ``logging`` goes to the same sinks.
    """
    global _summarizer
    import atexit
    import logging

    from loguru import logger

    if _summarizer is not None:
        _summarizer.close()
        _summarizer = None
    logger.remove()
    level = level.upper()
    patcher: Callable[[Any], None] = lambda record: None  # noqa: E731
    if repeat_interval > 0:
        def emit(at: str, message: str, extra: dict[str, Any]) -> None:
            logger.bind(**extra).log(at, "{}", message)

        _summarizer = RepeatSummarizer(repeat_interval, emit)
        _summarizer.start()
        atexit.register(_summarizer.close)
        patcher = _summarizer
    _extra.clear()
    _extra["component"] = component
    logger.configure(extra=dict(_extra), patcher=patcher)
    fmt: Any = _json_format if json else _FORMAT
    logger.add(sys.stderr, level=level, format=fmt, filter=_not_dropped, backtrace=False,
               diagnose=False, colorize=None if not json else False)
    if file:
        try:
            logger.add(file, level=level, format=fmt, filter=_not_dropped, colorize=False,
                       backtrace=False, diagnose=False, rotation=rotation, retention=retention,
                       encoding="utf-8")
        except (TypeError, ValueError) as exc:  # loguru's parse of "100 MB", "1 week"...
            raise ValueError(f"[log] rotation {rotation!r} / retention {retention!r}: {exc}") from None
    logging.basicConfig(handlers=[_stdlib_handler()], level=logger.level(level).no, force=True)
    # HTTP client libraries log every request at INFO: one line per etcd call is noise that
    # buries the events an operator looks for (their warnings and errors still come through)
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logger.level(level).no))


def write_pid_file(path: str | os.PathLike[str]) -> Path:
    """Write this process's pid to ``path`` (atomically), removed again at a normal exit.

    A file that names a live process other than this one is an error (a second instance);
    a stale one (its process gone) is replaced.
    """
    import atexit
    import contextlib
    from pathlib import Path

    p = Path(path)
    with contextlib.suppress(FileNotFoundError, ValueError):
        other = int(p.read_text().split()[0])
        if other != os.getpid() and pid_alive(other):
            raise RuntimeError(f"pid file {str(p)!r} names process {other}, which is running")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(p)
    mine = os.getpid()

    def remove() -> None:
        with contextlib.suppress(OSError, ValueError):
            if int(p.read_text().split()[0]) == mine:
                p.unlink()

    atexit.register(remove)
    return p


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: the kernel refused the probe)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
