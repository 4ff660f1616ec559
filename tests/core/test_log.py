"""Logs for operators (xcecore.log): ISO 8601 time with offset on every line, flat JSON lines,
rotation and retention, the standard library's logging through the same sinks, repeats
summarized once per interval, and the pid file. In-process against real files; the outage
and pid-file tests against real role processes."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from xcecore import log as xlog
from xcecore.testing import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(120)
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(?:[+-]\d\d:\d\d|Z)"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``setup(**kw)``: xcecore's logging to a file in tmp_path; restored afterwards."""
    def make(**kw: Any) -> Path:
        path = tmp_path / "x.log"
        xlog.setup_logging("worker@n1", kw.pop("level", "INFO"), file=str(path), **kw)
        return path

    yield make
    if xlog._summarizer is not None:
        xlog._summarizer.close()
        xlog._summarizer = None
    logger.remove()
    logger.configure(patcher=lambda record: None, extra={})
    logger.add(sys.stderr)
    logging.basicConfig(handlers=[], force=True)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_every_line_has_date_time_and_offset(setup: Callable[..., Path]) -> None:
    path = setup()
    logger.info("hello {}", 1)
    line = lines(path)[0]
    assert re.match(ISO + r" INFO    worker@n1 \| hello 1$", line), line
    assert re.fullmatch(ISO, xlog.stamp())


def test_json_lines_are_flat(setup: Callable[..., Path]) -> None:
    path = setup(json=True)
    logger.bind(candidate="127.0.0.1:7600", jobid=7).warning("job {} lost", 7)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("it failed")
    first, second = (json.loads(x) for x in lines(path) if x.startswith("{"))
    assert re.fullmatch(ISO, first.pop("time"))
    assert first == {"level": "WARNING", "component": "worker@n1", "role": "worker", "host": "n1",
                     "message": "job 7 lost", "logger": __name__, "candidate": "127.0.0.1:7600",
                     "jobid": 7}
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_file_rotation_and_retention(setup: Callable[..., Path], tmp_path: Path) -> None:
    path = setup(rotation="2 KB", retention=2)
    for i in range(200):
        logger.info("line {} {}", i, "x" * 40)
    files = sorted(tmp_path.glob("x*.log"))
    assert path in files and len(files) == 3, files  # the current one and two rotated
    assert all(f.stat().st_size < 4096 for f in files)
    assert lines(path)[-1].endswith(f"line 199 {'x' * 40}")


def test_bad_rotation_is_named(setup: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match="rotation 'sometimes'"):
        setup(rotation="sometimes")


def test_standard_library_logging_goes_through_the_same_sink(setup: Callable[..., Path]) -> None:
    path = setup()
    logging.getLogger("uvicorn.error").warning("Started server process [%d]", 42)
    logging.getLogger("httpx").debug("not at INFO")
    (line,) = lines(path)
    assert re.match(ISO + r" WARNING worker@n1 \| Started server process \[42\]$", line), line


def test_repeats_are_summarized_once_per_interval() -> None:
    now = [0.0]
    out: list[tuple[str, str]] = []
    summ = xlog.RepeatSummarizer(10.0, lambda lvl, msg, extra: out.append((lvl, msg)),
                                 clock=lambda: now[0])
    shown: list[str] = []

    def log(site: int, msg: str, level: int = 30) -> None:
        rec: Any = {"extra": {"component": "api@h"}, "name": "m", "function": "f", "line": site,
                    "level": type("L", (), {"no": level, "name": "WARNING"})(), "message": msg}
        summ(rec)
        if not rec["extra"].get("_drop"):
            shown.append(rec["message"])

    for i in range(120):  # 12 lines/s for 10 s from one call site, 4/s from another
        now[0] = i / 12
        log(1, "backend unavailable")
        if i % 3 == 0:
            log(2, "no primary")
        log(3, f"started job {i}", level=20)  # INFO: distinct events, never merged
    log(4, "candidate 127.0.0.1:7600 refused")  # one call site, two templates: two events
    log(4, "lost connection to 127.0.0.1:7600")
    log(4, "candidate 127.0.0.1:7601 refused")  # the first one's template again: merged
    assert shown[-2:] == ["candidate 127.0.0.1:7600 refused", "lost connection to 127.0.0.1:7600"]
    now[0] = 10.0
    log(1, "backend unavailable")
    assert shown.count("backend unavailable") == 1 and shown.count("no primary") == 1
    assert "backend unavailable (repeated 119 times in the last 10 s)" in shown
    assert sum(s.startswith("started job") for s in shown) == 120
    now[0] = 25.0  # the outage ended: the flush reports what the last interval suppressed
    summ.flush()
    assert out == [("WARNING", "no primary (repeated 39 times in the last 25 s)"),
                   ("WARNING", "candidate 127.0.0.1:7601 refused (repeated 1 times in the last 15 s)")]
    now[0] = 26.0
    log(2, "no primary")  # within the interval the flush began: counted, not shown
    assert shown.count("no primary") == 1
    summ.close()  # at exit: the count still open is written
    assert out[-1] == ("WARNING", "no primary (repeated 1 times in the last 1 s)")


def test_an_outage_logs_about_one_line_per_interval_per_event(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    interval, watch = 1.0, 5.0
    cl = xce_cluster(1, extra_config=f'[log]\nrepeat_interval = {interval}\n'
                                     '[apiserver]\nlisten = "127.0.0.1:0"\n')
    w = cl.start_role("worker", 'worker.hname="out1"', f'worker.state_dir="{tmp_path / "w"}"',
                      "worker.hello_interval=0.2", name="w")
    api = cl.start_role("apiserver", name="api")
    wait_for(lambda: "joined as worker" in w.text() and "listening" in api.text(), 30,
             what="worker and API server up")
    cl.candidates[0].kill()
    start = {p.name: len(p.text().splitlines()) for p in (w, api)}
    time.sleep(watch)  # not synchronisation: the window whose lines are counted
    for proc in (w, api):
        new = proc.text().splitlines()[start[proc.name]:]
        warnings = [x for x in new if " WARNING " in x or " ERROR " in x]
        by_event = Counter(re.sub(r"\d+", "N", x.split(" | ", 1)[1]).split(" (repeated")[0]
                           for x in warnings)
        assert warnings, f"{proc.name} logged nothing during the outage:\n" + "\n".join(new)
        # Unsummarized, the API server logged ~10 of these per second here; now each distinct
        # event: its first line, then at most one per interval (and one line of slack).
        assert max(by_event.values()) <= watch / interval + 2, (proc.name, by_event)
        assert any("(repeated " in x for x in warnings), (proc.name, warnings)


def test_xce_run_pid_file(xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    pid_file = tmp_path / "run" / "scheduler.pid"
    proc = subprocess.Popen([sys.executable, "-m", "xcecore", "--config", str(cl.config_path), "run",
                             "scheduler", "--pid-file", str(pid_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: pid_file.exists(), 30, what="the pid file")
        assert pid_file.read_text() == f"{proc.pid}\n"
        second = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path),
                                 "run", "scheduler", "--pid-file", str(pid_file)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and f"names process {proc.pid}, which is running" in second.stderr
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not pid_file.exists()


def test_a_candidates_json_lines_name_it(xce_cluster: Callable[..., LocalCluster]) -> None:
    cl = xce_cluster(1, extra_config="[log]\njson = true\n")
    text = cl.candidates[0].text()
    records = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    assert records and len(records) == len(text.splitlines()), text
    promoted = next(r for r in records if "promoted to primary" in r["message"])
    assert promoted["candidate"] == cl.address(0) and promoted["role"] == "controller", promoted
    assert re.fullmatch(ISO, promoted["time"]) and promoted["level"] == "INFO"
