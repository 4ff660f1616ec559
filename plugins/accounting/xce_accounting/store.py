"""The accounting store: one small interface, SQLite (default) and PostgreSQL behind it.

Both dialects run the same SQL (written with ``?`` placeholders; PostgreSQL's driver gets
``%s``) and the same migrations (:mod:`xce_accounting.schema`). A store object belongs to one
thread: the role's writer thread owns one, its query threads one each.

- :meth:`Store.write` commits a :class:`Batch` in one transaction; every insert is
  ``ON CONFLICT DO NOTHING`` on the row's key, so a batch written twice writes nothing twice.
- :meth:`Store.views` gives the last committed view of jobs (where the role continues after
  a restart); :meth:`Store.marks` the role's own marks (last primary, hosts' and members'
  last recorded states, the highest job id recorded).
- Queries: :meth:`jobs` (paged), :meth:`summary`, :meth:`job`, :meth:`events`.
- :meth:`prune`: retention by age and size, in bounded batches.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orjson import dumps

from xce_accounting.record import ATTEMPT_COLUMNS, AttemptRow, EventRow, View
from xce_accounting.schema import MIGRATIONS, VERSION_TABLE, statements

LOOKUP_CHUNK = 500
"""Job ids per ``views`` query."""
ATTEMPT_FIELDS = ", ".join('"user"' if c == "user" else c for c in ATTEMPT_COLUMNS)
_INSERT_ATTEMPT = (f"INSERT INTO attempts ({ATTEMPT_FIELDS}) VALUES "
                   f"({', '.join('?' * len(ATTEMPT_COLUMNS))}) ON CONFLICT DO NOTHING")
_EVENT_FIELDS = 'jobid, seq, attempt, kind, time, "user", detail, view'
_INSERT_EVENT = (f"INSERT INTO events ({_EVENT_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT DO NOTHING")
COPY_MIN = 64
"""Rows from which PostgreSQL inserts go through COPY."""
_INSERT_CLUSTER = "INSERT INTO cluster_events (time, kind, subject, detail) VALUES (?, ?, ?, ?)"
_SET_MARK = ("INSERT INTO marks (name, value) VALUES (?, ?) "
             "ON CONFLICT (name) DO UPDATE SET value = excluded.value")


class StoreError(Exception):
    """The store cannot be opened or written (the message names the database)."""


class QueryError(ValueError):
    """A query's arguments are wrong (a bad cursor): the caller's fault."""


@dataclass(slots=True)
class ClusterEvent:
    """One cluster event: a promotion, a member joined or left, a host's state."""

    time: float
    kind: str
    subject: str
    detail: dict[str, Any]


@dataclass(slots=True)
class Batch:
    """Rows to commit together."""

    events: list[EventRow] = field(default_factory=list)
    attempts: list[AttemptRow] = field(default_factory=list)
    cluster: list[ClusterEvent] = field(default_factory=list)
    marks: dict[str, Any] = field(default_factory=dict)

    def extend(self, other: Batch) -> None:
        """Add ``other``'s rows (marks: the later value wins)."""
        self.events.extend(other.events)
        self.attempts.extend(other.attempts)
        self.cluster.extend(other.cluster)
        self.marks.update(other.marks)

    def __len__(self) -> int:
        return len(self.events) + len(self.attempts) + len(self.cluster)


@dataclass(frozen=True, slots=True)
class Filters:
    """Filters of finished attempts (None: not filtered)."""

    owner: str | None = None
    queue: str | None = None
    project: str | None = None
    host: str | None = None
    state: str | None = None
    since: float | None = None
    until: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The WHERE clause (without the keyword; ``1=1`` when empty) and its parameters."""
        parts: list[str] = []
        params: list[Any] = []
        for col, value in (('"user"', self.owner), ("queue", self.queue),
                           ("project", self.project), ("state", self.state)):
            if value is not None:
                parts.append(f"{col} = ?")
                params.append(value)
        if self.host is not None:
            escaped = self.host.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            parts.append("hosts LIKE ? ESCAPE '\\'")
            params.append(f"%,{escaped},%")
        if self.since is not None:
            parts.append("end_time >= ?")
            params.append(self.since)
        if self.until is not None:
            parts.append("end_time < ?")
            params.append(self.until)
        return (" AND ".join(parts) or "1=1"), params


def _attempt_dict(row: Sequence[Any]) -> dict[str, Any]:
    out = dict(zip(ATTEMPT_COLUMNS, row, strict=True))
    out["hosts"] = [h for h in (out["hosts"] or "").split(",") if h]
    return out


def _percentile_offset(n: int, p: float) -> int:
    """The offset of the ``p`` percentile (nearest rank) among ``n`` sorted values."""
    rank = max(1, -(-int(p * n * 1000) // 100000))  # ceil(p/100 * n) without float drift
    return min(n, rank) - 1


class Store:
    """One connection to the accounting database (one thread's)."""

    def __init__(self, conn: Any, dialect: str, where: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.where = where  # the database, for messages

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def sqlite(cls, path: str | Path) -> Store:
        """A SQLite store at ``path`` (WAL; created and migrated if needed)."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=30, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"accounting database {path}: cannot open it: {exc}") from None
        store = cls(conn, "sqlite", str(path))
        store.migrate()
        return store

    @classmethod
    def postgresql(cls, dsn: str) -> Store:
        """A PostgreSQL store (psycopg 3) at ``dsn`` (migrated if needed)."""
        try:
            import psycopg
        except ImportError:
            raise StoreError("[accounting] backend 'postgresql' needs psycopg 3: "
                             "pip install 'psycopg[binary]'") from None
        try:
            conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"accounting database (PostgreSQL, {_redact(dsn)}): cannot connect: "
                             f"{str(exc).strip()}") from None
        store = cls(conn, "postgresql", _redact(dsn))
        store.migrate()
        return store

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.dialect == "postgresql" else text

    def _exec(self, text: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self._sql(text), params)

    def _many(self, text: str, rows: Iterable[Sequence[Any]]) -> None:
        cur = self.conn.cursor()
        cur.executemany(self._sql(text), rows)

    def _begin(self) -> None:
        self.conn.execute("BEGIN")

    def _commit(self) -> None:
        self.conn.execute("COMMIT")

    def _rollback(self) -> None:
        with contextlib.suppress(Exception):  # the connection is gone: the next use says so
            self.conn.execute("ROLLBACK")

    def migrate(self) -> int:
        """Apply every migration not applied yet, in order, each in its own transaction;
        the schema version reached."""
        self._exec(VERSION_TABLE)
        done = {int(r[0]) for r in self._exec("SELECT version FROM schema_version").fetchall()}
        if done and max(done) > len(MIGRATIONS):
            raise StoreError(f"accounting database {self.where} has schema version {max(done)}, "
                             f"newer than this xce-accounting knows ({len(MIGRATIONS)})")
        for number in range(1, len(MIGRATIONS) + 1):
            if number in done:
                continue
            self._begin()
            try:
                for stmt in statements(self.dialect, number):
                    self._exec(stmt)
                self._exec("INSERT INTO schema_version (version, applied) VALUES (?, ?)",
                           (number, time.time()))
                self._commit()
            except Exception:
                self._rollback()
                raise
        return len(MIGRATIONS)

    def version(self) -> int:
        """The schema version applied."""
        row = self._exec("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    # -- writing --------------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        """Commit ``batch`` in one transaction (rows already present are left as they are)."""
        self._begin()
        try:
            if batch.attempts:
                self._insert("attempts", ATTEMPT_FIELDS, _INSERT_ATTEMPT, [a.values for a in batch.attempts])
            if batch.events:
                self._insert("events", _EVENT_FIELDS, _INSERT_EVENT, [
                    (e.jobid, e.seq, e.attempt, e.kind, e.time, e.user, dumps(e.detail).decode(),
                     "" if e.view is None else dumps(e.view.to_json()).decode())
                    for e in batch.events])
            if batch.cluster:
                self._many(_INSERT_CLUSTER, [(c.time, c.kind, c.subject, dumps(c.detail).decode())
                                             for c in batch.cluster])
            if batch.marks:
                self._many(_SET_MARK, [(k, json.dumps(v)) for k, v in batch.marks.items()])
            self._commit()
        except Exception:
            self._rollback()
            raise

    def _insert(self, table: str, fields: str, insert: str, rows: list[Sequence[Any]]) -> None:
        """Insert ``rows``, those already present left as they are. PostgreSQL takes a large
        batch through COPY into a per-session staging table (row by row, the round trips cost
        more than the writes)."""
        if self.dialect != "postgresql" or len(rows) < COPY_MIN:
            self._many(insert, rows)
            return
        cur = self.conn.cursor()
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS stage_{table} (LIKE {table}) ON COMMIT DELETE ROWS")
        with cur.copy(f"COPY stage_{table} ({fields}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cur.execute(f"INSERT INTO {table} ({fields}) SELECT {fields} FROM stage_{table} ON CONFLICT DO NOTHING")

    def views(self, jobids: Sequence[int]) -> dict[int, View]:
        """The last committed view of each of ``jobids`` that has events."""
        out: dict[int, View] = {}
        for i in range(0, len(jobids), LOOKUP_CHUNK):
            chunk = list(jobids[i:i + LOOKUP_CHUNK])
            marks = ", ".join("?" * len(chunk))
            rows = self._exec(
                f"SELECT e.jobid, e.view FROM events e JOIN (SELECT jobid, max(seq) AS seq "
                f"FROM events WHERE jobid IN ({marks}) GROUP BY jobid) last "
                f"ON e.jobid = last.jobid AND e.seq = last.seq", chunk).fetchall()
            for jobid, view in rows:
                if view:  # (every observation's last event has one)
                    out[int(jobid)] = View.from_json(json.loads(view))
        return out

    def marks(self) -> dict[str, Any]:
        """The role's marks."""
        return {name: json.loads(value) for name, value in
                self._exec("SELECT name, value FROM marks").fetchall()}

    # -- retention ------------------------------------------------------------------------

    def prune(self, keep_days: float, max_rows: int, batch: int, now: float | None = None) -> int:
        """Remove at most ``batch`` rows of each table that are older than ``keep_days`` or
        beyond ``max_rows`` attempts (events: ten per attempt), oldest first; rows removed."""
        now = time.time() if now is None else now
        removed = 0
        if keep_days > 0:
            limit = now - keep_days * 86400
            removed += self._delete(
                "DELETE FROM attempts WHERE (jobid, attempt) IN (SELECT jobid, attempt FROM "
                "attempts WHERE end_time < ? ORDER BY end_time LIMIT ?)", (limit, batch))
            removed += self._delete(
                "DELETE FROM events WHERE (jobid, seq) IN (SELECT jobid, seq FROM events "
                "WHERE time < ? ORDER BY time LIMIT ?)", (limit, batch))
            removed += self._delete(
                "DELETE FROM cluster_events WHERE id IN (SELECT id FROM cluster_events "
                "WHERE time < ? ORDER BY time LIMIT ?)", (limit, batch))
        if max_rows > 0:
            for table, cap, key, order in (("attempts", max_rows, "(jobid, attempt)", "end_time"),
                                           ("events", max_rows * 10, "(jobid, seq)", "time")):
                count = int(self._exec(f"SELECT count(*) FROM {table}").fetchone()[0])
                over = min(batch, count - cap)
                if over > 0:
                    removed += self._delete(
                        f"DELETE FROM {table} WHERE {key} IN (SELECT {key[1:-1]} FROM {table} "
                        f"ORDER BY {order} LIMIT ?)", (over,))
        return removed

    def _delete(self, text: str, params: Sequence[Any]) -> int:
        self._begin()
        try:
            cur = self._exec(text, params)
            self._commit()
        except Exception:
            self._rollback()
            raise
        return max(0, int(cur.rowcount or 0))

    # -- queries --------------------------------------------------------------------------

    def jobs(self, f: Filters, limit: int, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """Finished attempts matching ``f``, newest end first; the page and the next cursor."""
        where, params = f.where()
        if cursor is not None:
            end, jobid, attempt = _parse_cursor(cursor, 3)
            where += " AND (end_time, jobid, attempt) < (?, ?, ?)"
            params += [end, int(jobid), int(attempt)]
        rows = self._exec(f"SELECT {ATTEMPT_FIELDS} FROM attempts WHERE {where} "
                          "ORDER BY end_time DESC, jobid DESC, attempt DESC LIMIT ?",
                          [*params, limit + 1]).fetchall()
        page = [_attempt_dict(r) for r in rows[:limit]]
        nxt = None
        if len(rows) > limit:
            last = page[-1]
            nxt = f"{last['end_time']!r}:{last['jobid']}:{last['attempt']}"
        return page, nxt

    def summary(self, f: Filters) -> dict[str, Any]:
        """Counts, CPU and wall hours, wait-time percentiles, failures by reason."""
        where, params = f.where()
        row = self._exec(
            "SELECT count(*), sum(CASE WHEN state = 'DONE' THEN 1 ELSE 0 END), "
            "sum(CASE WHEN state = 'EXIT' THEN 1 ELSE 0 END), "
            "sum(CASE WHEN state = 'REQUEUED' THEN 1 ELSE 0 END), sum(cpu_time), "
            "sum(wall_time * slots), avg(wait_time), "
            f"sum(CASE WHEN wait_time IS NULL THEN 0 ELSE 1 END) FROM attempts WHERE {where}",
            params).fetchone()
        jobs, done, exited, requeued, cpu, wall, mean_wait, nwait = row
        waits: dict[str, float | None] = {"p50": None, "p90": None, "p99": None,
                                          "mean": float(mean_wait) if mean_wait is not None else None}
        nwait = int(nwait or 0)
        for name, p in (("p50", 50), ("p90", 90), ("p99", 99)):
            if nwait:
                found = self._exec(f"SELECT wait_time FROM attempts WHERE {where} AND wait_time "
                                   "IS NOT NULL ORDER BY wait_time LIMIT 1 OFFSET ?",
                                   [*params, _percentile_offset(nwait, p)]).fetchone()
                waits[name] = float(found[0]) if found else None
        failures = {str(reason or "unknown"): int(n) for reason, n in self._exec(
            f"SELECT reason, count(*) FROM attempts WHERE {where} AND state <> 'DONE' "
            "GROUP BY reason ORDER BY count(*) DESC, reason LIMIT 50", params).fetchall()}
        return {"jobs": int(jobs or 0), "done": int(done or 0), "exit": int(exited or 0),
                "requeued": int(requeued or 0), "cpu_hours": float(cpu or 0) / 3600,
                "wall_hours": float(wall or 0) / 3600, "wait": waits, "failures": failures}

    def job(self, jobid: int) -> dict[str, Any] | None:
        """A job's attempts and whole timeline; None if nothing is recorded for it."""
        attempts = [_attempt_dict(r) for r in self._exec(
            f"SELECT {ATTEMPT_FIELDS} FROM attempts WHERE jobid = ? ORDER BY attempt",
            (jobid,)).fetchall()]
        events = [_event_dict(r) for r in self._exec(
            'SELECT jobid, seq, attempt, kind, time, "user", detail FROM events WHERE jobid = ? '
            "ORDER BY seq", (jobid,)).fetchall()]
        if not attempts and not events:
            return None
        user = attempts[0]["user"] if attempts else events[0]["user"]
        return {"jobid": jobid, "user": user, "attempts": attempts, "events": events,
                "gaps": sum(1 for e in events if e["kind"] == "gap")}

    def job_events(self, jobid: int, limit: int, cursor: str | None, since: float | None,
                   until: float | None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of one job's events in seq order."""
        where, params = "jobid = ?", [jobid]
        if cursor is not None:
            where += " AND seq > ?"
            params.append(int(_parse_cursor(cursor, 1)[0]))
        where, params = _window(where, params, since, until)
        rows = self._exec(f'SELECT jobid, seq, attempt, kind, time, "user", detail FROM events '
                          f"WHERE {where} ORDER BY seq LIMIT ?", [*params, limit + 1]).fetchall()
        page = [_event_dict(r) for r in rows[:limit]]
        return page, (str(page[-1]["seq"]) if len(rows) > limit else None)

    def cluster_events(self, limit: int, cursor: str | None, since: float | None,
                       until: float | None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of cluster events in the order they were recorded."""
        where, params = "1=1", []
        if cursor is not None:
            where += " AND id > ?"
            params.append(int(_parse_cursor(cursor, 1)[0]))
        where, params = _window(where, params, since, until)
        rows = self._exec(f"SELECT id, time, kind, subject, detail FROM cluster_events WHERE "
                          f"{where} ORDER BY id LIMIT ?", [*params, limit + 1]).fetchall()
        page = [{"id": int(r[0]), "time": r[1], "kind": r[2], "subject": r[3],
                 "detail": json.loads(r[4])} for r in rows[:limit]]
        return page, (str(page[-1]["id"]) if len(rows) > limit else None)


def _window(where: str, params: list[Any], since: float | None, until: float | None) -> tuple[str, list[Any]]:
    if since is not None:
        where += " AND time >= ?"
        params.append(since)
    if until is not None:
        where += " AND time < ?"
        params.append(until)
    return where, params


def _event_dict(r: Sequence[Any]) -> dict[str, Any]:
    return {"jobid": int(r[0]), "seq": int(r[1]), "attempt": int(r[2]), "kind": r[3],
            "time": r[4], "user": r[5], "detail": json.loads(r[6])}


CURSOR_PART_MAX = 2.0 ** 62
"""A cursor's parts are times and ids: finite, and within SQLite's 64-bit integers."""


def _parse_cursor(cursor: str, parts: int) -> list[float]:
    try:
        values = [float(p) for p in cursor.split(":")]
    except ValueError:
        values = []
    # "inf", "nan" or 1e300 parse as floats but are no time or id this store hands out.
    if len(values) != parts or not all(abs(v) < CURSOR_PART_MAX for v in values):
        raise QueryError(f"argument 'cursor': {cursor[:64]!r} is not one this query returned as 'next'")
    return values


def _redact(dsn: str) -> str:
    """A DSN without its password, for messages and logs."""
    import re

    return re.sub(r"(password\s*=\s*)\S+|(://[^:/@]+:)[^@]+@", lambda m: (m.group(1) or m.group(2)) + "***"
                  + ("" if m.group(1) else "@"), dsn)
