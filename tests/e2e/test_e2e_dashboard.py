"""The dashboard in a real headless Chromium against a real cluster, and its event stream.

Three controller candidates, a worker, a scheduler and the API server, all real processes.
The browser signs in through the page, sees a job submitted through REST, and when the
primary is SIGKILLed shows the new primary without a reload (the stream says so).

With ``XCE_DASHBOARD_SCREENSHOTS=DIR`` the browser test also saves each panel as
``DIR/dashboard-<panel>.png`` (``docs/dashboard_screenshots.sh`` makes those in ``docs/``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from dashkit import PASSWORD, USER, binary, chromium, logon, start_api

from xcecore.testing import LocalCluster, Proc, wait_for
from xcecore.testing.cluster import free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e]

CONFIG = '[controller]\nhost_timeout = 60.0\n'


def _cluster(xce_cluster: Any, tmp_path: Path) -> tuple[LocalCluster, Proc, str]:
    cl: LocalCluster = xce_cluster(3, extra_config=CONFIG)
    cl.start_role("worker", 'worker.hname="d1"', f'worker.state_dir="{tmp_path / "d1"}"',
                  "worker.monitor_interval=0.5", name="d1")
    cl.start_role("scheduler")
    api, base = start_api(cl, tmp_path, f"127.0.0.1:{free_port()}")
    return cl, api, base


def test_dashboard_in_chromium_follows_jobs_and_a_failover(xce_cluster: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    cl, api, base = _cluster(xce_cluster, tmp_path)
    shots = os.environ.get("XCE_DASHBOARD_SCREENSHOTS")
    hdr = logon(base)
    with chromium(tmp_path) as drv:
        wait = WebDriverWait(drv, 30, poll_frequency=0.1)

        def text(css: str) -> str:
            # The live page re-renders rows as pushes arrive: an element found may be replaced
            # before its text is read, so a stale one is looked up again.
            for _ in range(50):
                try:
                    return str(drv.find_element(By.CSS_SELECTOR, css).text)
                except StaleElementReferenceException:
                    continue
            raise AssertionError(f"{css}: replaced 50 times in a row while being read")

        def click(css: str) -> None:
            for _ in range(50):
                try:
                    drv.find_element(By.CSS_SELECTOR, css).click()
                    return
                except StaleElementReferenceException:
                    continue
            raise AssertionError(f"{css}: replaced 50 times in a row while being clicked")

        def shot(name: str) -> None:
            if shots:
                drv.save_screenshot(str(Path(shots) / f"dashboard-{name}.png"))

        drv.get(f"{base}/xce/v1/ui/")
        wait.until(lambda d: d.find_element(By.ID, "signin-form").is_displayed())
        shot("signin")
        drv.find_element(By.ID, "username").send_keys(USER)
        drv.find_element(By.ID, "password").send_keys("wrong")
        drv.find_element(By.ID, "signin-button").click()
        wait.until(lambda d: "logon failed" in text("#signin-error"))
        drv.find_element(By.ID, "password").clear()
        drv.find_element(By.ID, "password").send_keys(PASSWORD)
        drv.find_element(By.ID, "signin-button").click()
        wait.until(lambda d: text("#live") == "live")
        assert drv.execute_script("return sessionStorage.getItem('xce.token')")
        primary = cl.address(cl.wait_primary())
        wait.until(lambda d: text("#primary") == primary)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#candidates tr")) == 3)
        assert primary in text("#candidates")

        # A job submitted through REST appears on the page, and runs, live.
        r = httpx.post(f"{base}/xce/v1/jobs", json={"command": "sleep 120", "name": "from-rest"},
                       headers=hdr)
        assert r.status_code == 200 and r.json()["code"] == 201, r.text
        jobid = r.json()["data"]["jobid"]
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=jobs]").click()
        row = f'#jobs tr[data-jobid="{jobid}"]'
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
        assert "from-rest" in text(row)
        wait.until(lambda d: "RUN" in text(row))
        # The state filter is applied by the server: a DONE filter hides the running job.
        Select(drv.find_element(By.ID, "f-state")).select_by_visible_text("DONE")
        drv.find_element(By.CSS_SELECTOR, "#job-filter button").click()
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, row) and "no jobs" in text("#jobs-page"))
        Select(drv.find_element(By.ID, "f-state")).select_by_visible_text("RUN")
        drv.find_element(By.CSS_SELECTOR, "#job-filter button").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
        click(row)
        wait.until(lambda d: "started" in text("#jd-timeline") and "d1" in text("#jd-timeline"))
        shot("jobs")
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=hosts]").click()
        wait.until(lambda d: "d1" in text("#hosts") and "1 / " in text("#hosts"))
        shot("hosts")
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=queues]").click()
        wait.until(lambda d: "normal" in text("#queues"))
        shot("queues")
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=events]").click()
        wait.until(lambda d: text("#events-note") == "events not available on this server"
                   or d.find_elements(By.CSS_SELECTOR, "#events tr"))
        shot("events")

        # SIGKILL the primary: the page shows the new one without a reload.
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=cluster]").click()
        drv.execute_script("window.__sameDocument = 'yes'")
        old, new = cl.kill_primary()
        wait.until(lambda d: text("#primary") == cl.address(new))
        assert drv.execute_script("return window.__sameDocument") == "yes", "the page reloaded"
        wait.until(lambda d: f"{cl.address(old)} \u2192 {cl.address(new)}" in text("#failovers"))
        wait.until(lambda d: "primary" in text("#candidates") and
                   len(d.find_elements(By.CSS_SELECTOR, "#candidates tr")) == 2)
        shot("cluster")
        # Changes after the failover still arrive live.
        r = httpx.post(f"{base}/xce/v1/jobs/{jobid}/control", json={"action": "kill"}, headers=hdr,
                       timeout=30)
        assert r.status_code == 200, r.text
        drv.find_element(By.CSS_SELECTOR, "nav a[data-panel=jobs]").click()
        Select(drv.find_element(By.ID, "f-state")).select_by_visible_text("any")
        drv.find_element(By.CSS_SELECTOR, "#job-filter button").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row) and "EXIT" in text(row))
        wait.until(lambda d: "ended" in text("#jd-timeline") and "killed by owner" in text("#jd-timeline"))

        # The API server dies and comes back on its address: the page reconnects (a new
        # ticket) and re-fetches, still without a reload.
        api.kill()
        wait.until(lambda d: text("#live") != "live")
        start_api(cl, tmp_path, base.removeprefix("http://"))
        wait.until(lambda d: text("#live") == "live")
        r = httpx.post(f"{base}/xce/v1/jobs", json={"command": "true", "name": "after-restart"},
                       headers=hdr)
        assert r.status_code == 200, r.text
        wait.until(lambda d: "after-restart" in text("#jobs"))
        assert drv.execute_script("return window.__sameDocument") == "yes", "the page reloaded"


def test_a_missing_browser_fails_naming_it() -> None:
    with pytest.raises(RuntimeError, match="no-such-chromium not found on PATH.*chromium-driver"):
        binary("no-such-chromium")


class Events:
    """A real HTTP client reading ``GET /stream`` on a thread: every event, in order."""

    def __init__(self, base: str, hdr: dict[str, str]) -> None:
        r = httpx.post(f"{base}/xce/v1/stream/ticket", headers=hdr)
        assert r.status_code == 200, r.text
        self.url = f"{base}/xce/v1/stream?ticket={r.json()['data']['ticket']}"
        self.got: list[tuple[str, Any]] = []
        self.comments = 0
        self.ended = threading.Event()
        self.status = 0
        self._http = httpx.Client(timeout=httpx.Timeout(60.0, read=60.0))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with self._http.stream("GET", self.url) as r:
                self.status = r.status_code
                event = ""
                for line in r.iter_lines():
                    if line.startswith(":"):
                        self.comments += 1
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        self.got.append((event, orjson.loads(line[6:])))
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()

    def of(self, kind: str) -> list[Any]:
        return [d for e, d in list(self.got) if e == kind]

    def close(self) -> None:
        self._http.close()
        self._thread.join(10)


def test_stream_pushes_changes_and_the_failover(xce_cluster: Any, tmp_path: Path) -> None:
    cl, _, base = _cluster(xce_cluster, tmp_path)
    hdr = logon(base)
    assert httpx.get(f"{base}/xce/v1/stream").status_code == 401
    assert httpx.get(f"{base}/xce/v1/stream?ticket=forged").status_code == 401
    ev = Events(base, hdr)
    try:
        wait_for(lambda: ev.of("hello"), 20, what="the stream's hello")
        assert ev.status == 200
        primary = cl.address(cl.wait_primary())
        assert ev.of("hello")[0]["server"] == primary and ev.of("hello")[0]["link"] == "up"
        # The ticket was used up: a second stream with it is refused.
        assert httpx.get(ev.url).status_code == 401

        ids = [httpx.post(f"{base}/xce/v1/jobs", json={"command": "true", "name": f"s{i}"},
                          headers=hdr).json()["data"]["jobid"] for i in range(5)]

        def seen_done() -> bool:
            done = {j["jobid"] for d in ev.of("jobs") for j in d.get("items", ()) if j["state"] == "DONE"}
            return set(ids) <= done
        wait_for(seen_done, 60, what="every job's DONE in the stream")
        assert ev.of("hosts"), "the worker's load updates came as host changes"

        old, new = cl.kill_primary()
        wait_for(lambda: any(d["server"] == cl.address(new) and d["link"] == "up"
                             for d in ev.of("cluster")), 60, what="the stream naming the new primary")
        last = [d for d in ev.of("cluster") if d["server"] == cl.address(new)][-1]
        assert {"from": cl.address(old), "to": cl.address(new)}.items() <= last["failovers"][-1].items()
        assert not ev.ended.is_set(), "the stream survived the failover"
        status = httpx.get(f"{base}/xce/v1/cluster/status", headers=hdr).json()["data"]
        assert status["primary"] == cl.address(new)
        assert status["failovers"][-1]["to"] == cl.address(new)
    finally:
        ev.close()
