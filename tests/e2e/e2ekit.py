"""Helpers of the end-to-end suite: an HTTP client for the API server, job lookups."""

from __future__ import annotations

from typing import Any

import httpx
from xce_cli.up import Embedded

from xcecore.testing.cluster import wait_for


class Api:
    """An HTTP client logged on to the embedded cluster's API server as admin."""

    def __init__(self, emb: Embedded) -> None:
        port_file = emb.root / "api.port"
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 30, what="the API port file")
        self.base = emb.api_url()
        self.http = httpx.Client(base_url=self.base, timeout=30.0)
        wait_for(lambda: self.http.get("/readyz").status_code == 200, 30, what="the API server ready")
        r = self.http.post("/auth/logon", json={"username": "admin", "password": emb.password})
        assert r.status_code == 200, r.text
        self.hdr = {"Authorization": f"Bearer {r.json()['data']['token']}"}

    def submit(self, command: str, name: str, **kw: Any) -> httpx.Response:
        """POST /jobs."""
        return self.http.post("/jobs", json={"command": command, "name": name, **kw}, headers=self.hdr)

    def jobs(self) -> list[dict[str, Any]]:
        """GET /jobs (the API server's push-fed view)."""
        r = self.http.get("/jobs", headers=self.hdr)
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()


def jobs_named(emb: Embedded, prefix: str) -> list[dict[str, Any]]:
    """Every job (any state) whose name starts with ``prefix``, from the controller (every
    page of ``jobinfo``)."""
    found: list[dict[str, Any]] = []
    args: dict[str, Any] = {"limit": 1000}
    while True:
        page = emb.call("jobinfo", args, timeout=30)
        found += [j for j in page["jobs"] if j["name"].startswith(prefix)]
        if page["next"] is None:
            return found
        args["cursor"] = page["next"]
