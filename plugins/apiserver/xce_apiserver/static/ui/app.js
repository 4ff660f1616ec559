// The xce dashboard: REST for the first view of each panel, then the server-sent event
// stream (GET /xce/v1/stream) for every change; no timers poll the server. Text from the
// server is only ever set as textContent (never parsed as HTML).
"use strict";

const PREFIX = "/xce/v1";
const PAGE = 50;            // jobs per page
const MANY_REFETCH = 2000;  // ms between two re-fetches of a panel after a "many changed"
const $ = (id) => document.getElementById(id);

const ui = {
  token: sessionStorage.getItem("xce.token"),
  user: sessionStorage.getItem("xce.user"),
  stream: null,
  backoff: 1000,
  server: null,         // the controller the API server is joined to, as the stream says
  statusFor: null,      // the server the candidates table was fetched for
  jobs: new Map(),      // jobid -> row element of the current page
  jobCursors: [null],   // cursor of each page shown so far (first page: null)
  jobNext: null,
  detail: null,         // the jobid shown in the detail view
  hosts: new Map(),
  queues: new Map(),
  eventsSeq: 0,
  eventsAvailable: true,
  refetchAt: {},
};

class ApiError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (ui.token) headers["Authorization"] = "Bearer " + ui.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(PREFIX + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let env = null;
  try { env = await r.json(); } catch (e) { env = null; }
  if (r.status === 401 && path !== "/auth/logon") { signOut("signed out: " + (env ? env.msg : "401")); }
  if (!r.ok) throw new ApiError(r.status, env && env.msg ? env.msg : r.statusText);
  return env;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = document.createElement("td"); td.append(c); tr.append(td); }
    else tr.append(el("td", c));
  }
  if (cls) tr.className = cls;
  return tr;
}

function when(epoch) {
  if (epoch === null || epoch === undefined) return "-";
  return new Date(epoch * 1000).toLocaleString(undefined, { hour12: false });
}

function stateSpan(state) { return el("span", state, "state-" + state); }

// ------------------------------------------------------------------ sign-in
async function signIn(ev) {
  ev.preventDefault();
  $("signin-error").textContent = "";
  try {
    const env = await api("POST", "/auth/logon",
      { username: $("username").value, password: $("password").value });
    ui.token = env.data.token; ui.user = env.data.username;
    sessionStorage.setItem("xce.token", ui.token);
    sessionStorage.setItem("xce.user", ui.user);
    $("password").value = "";
    start();
  } catch (e) {
    $("signin-error").textContent = e.message;
  }
}

function signOut(why) {
  if (ui.token) {
    const token = ui.token;
    fetch(PREFIX + "/auth/logout", { method: "POST", headers: { "Authorization": "Bearer " + token } })
      .catch(() => {});
  }
  ui.token = null; ui.user = null;
  sessionStorage.removeItem("xce.token"); sessionStorage.removeItem("xce.user");
  if (ui.stream) { ui.stream.close(); ui.stream = null; }
  setLive(false);
  $("nav").hidden = true; $("logout").hidden = true; $("who").textContent = "";
  for (const p of document.querySelectorAll("section.panel")) p.hidden = p.id !== "signin";
  if (typeof why === "string") $("signin-error").textContent = why;
}

function start() {
  $("signin").hidden = true;
  $("nav").hidden = false; $("logout").hidden = false;
  $("who").textContent = ui.user;
  show();
  connect();
}

// ------------------------------------------------------------------ panels
function show() {
  const name = (location.hash || "#cluster").slice(1);
  for (const p of document.querySelectorAll("section.panel")) {
    p.hidden = p.id !== "panel-" + name;
  }
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.panel === name);
  }
}

async function loadAll() {
  await Promise.allSettled([loadStatus(), loadHosts(), loadQueues(), loadJobs(), loadEvents(true)]);
}

function refetchSoon(what, fn, delay = MANY_REFETCH) {
  // Re-fetch a panel once after a burst of changes (a "many changed" message: at most once
  // every MANY_REFETCH ms).
  if (ui.refetchAt[what]) return;
  ui.refetchAt[what] = setTimeout(() => { ui.refetchAt[what] = null; fn(); }, delay);
}

function burst(d, what, load) {
  // A "many changed" message (a burst too large to send item by item): re-fetch the panel
  // soon, once; true if ``d`` was one.
  if (d.many === undefined) return false;
  refetchSoon(what, load);
  return true;
}

function fillRows(body, rows, items, key, rowOf) {
  // A panel's rows, from a fetched list: each kept by its key for in-place updates.
  body.replaceChildren(); rows.clear();
  for (const item of items) { const tr = rowOf(item); rows.set(item[key], tr); body.append(tr); }
}

function onKeyed(d, what, rows, key, rowOf, load) {
  // A change of a panel keyed by name (hosts, queues): a shown row is replaced in place; a
  // new or removed one, or a burst, re-fetches the panel.
  if (burst(d, what, load)) return;
  let fresh = (d.removed || []).length > 0;
  for (const item of d.items) {
    const old = rows.get(item[key]);
    if (!old) { fresh = true; continue; }
    const tr = rowOf(item); old.replaceWith(tr); rows.set(item[key], tr);
  }
  if (fresh) load();
}

// Cluster: the candidates come from one status call, made on load and whenever the
// stream says the API server follows another controller.
async function loadStatus(attempt = 0) {
  const asked = ui.server;
  try {
    const env = await api("GET", "/cluster/status");
    const d = env.data;
    ui.statusFor = asked;
    if (d.primary) setPrimary(d.primary);
    $("primary-since").textContent = when(d.since);
    $("counts").textContent = `${d.jobs} / ${d.hosts} / ${d.members}`;
    $("backend").textContent = d.backend ? d.backend.backend : "-";
    const body = $("candidates"); body.replaceChildren();
    for (const c of d.candidates || []) {
      body.append(row([c.address, stateSpan(c.state), c.pid, when(c.since)]));
    }
    if (d.failovers) showFailovers(d.failovers);
    $("cluster-error").textContent = "";
  } catch (e) {
    $("cluster-error").textContent = "cluster status: " + e.message;
    if (attempt < 5 && e.status !== 401) setTimeout(() => loadStatus(attempt + 1), 1000 * (attempt + 1));
  }
}

function setPrimary(server) {
  $("primary").textContent = server || "-";
}

function showFailovers(list) {
  const ol = $("failovers"); ol.replaceChildren();
  if (!list.length) { ol.append(el("li", "no failover seen by this API server", "note")); return; }
  for (const f of list.slice().reverse()) {
    ol.append(el("li", `${when(f.time)}: ${f.from} \u2192 ${f.to}`));
  }
}

function onCluster(d) {
  const banner = $("link-banner");
  if (d.link === "lost") {
    banner.hidden = false;
    banner.textContent = "link to the primary lost; re-joining the next primary (" + (d.detail || "") + ")";
  } else {
    banner.hidden = true;
  }
  if (d.server) setPrimary(d.server);
  showFailovers(d.failovers || []);
  if (d.server && d.link === "up" && d.server !== ui.server) {
    ui.server = d.server;
    loadStatus();
    if (ui.eventsAvailable) loadEvents(false);
  }
  ui.server = d.server || ui.server;
}

// Hosts
function hostRow(h) {
  const li = h.loadIndices || {};
  const fmt = (v) => (v === null || v === undefined ? "-" : Number(v).toFixed(2));
  return row([h.hostName, stateSpan(h.status), fmt(li.r15s), fmt(li.r1m), fmt(li.ut), fmt(li.mem),
              `${h.usedSlots} / ${h.maxSlots}`, h.comment || ""]);
}

async function loadHosts() {
  const env = await api("GET", "/hosts");
  fillRows($("hosts"), ui.hosts, env.data, "hostName", hostRow);
  $("hosts-note").textContent = env.data.length ? "" : "no hosts have joined";
}

function onHosts(d) { onKeyed(d, "hosts", ui.hosts, "hostName", hostRow, loadHosts); }

// Queues
function queueRow(q) { return row([q.name, q.priority, q.status, q.description || ""]); }

async function loadQueues() {
  const env = await api("GET", "/queues");
  fillRows($("queues"), ui.queues, env.data, "name", queueRow);
}

function onQueues(d) {
  if (ui.eventsAvailable) refetchSoon("events", () => loadEvents(false), 500);  // a queue event
  onKeyed(d, "queues", ui.queues, "name", queueRow, loadQueues);
}

// Jobs: pages by cursor, filtered on the server.
function jobFilter() {
  const f = { state: $("f-state").value, user: $("f-user").value.trim(), queue: $("f-queue").value.trim() };
  return f;
}

function matches(job) {
  const f = jobFilter();
  return (!f.state || job.state === f.state) && (!f.user || job.user === f.user) &&
    (!f.queue || job.queue === f.queue);
}

function jobRow(j) {
  const hosts = (j.alloc || []).map((a) => a.host).join(" ");
  const tr = row([j.jobid, j.name || "", j.user, j.queue, stateSpan(j.state), when(j.submit_time), hosts],
                 "clickable");
  tr.dataset.jobid = j.jobid;
  tr.addEventListener("click", () => showJob(j.jobid));
  return tr;
}

// A change that arrives while a page is being fetched may be older or newer than the answer:
// the page is fetched once more after it (else a job's EXIT could be overwritten by the page
// fetched while it ended).
let jobsLoading = 0;
let jobsDirty = false;

async function loadJobs() {
  jobsLoading += 1;
  jobsDirty = false;
  try {
    await loadJobsPage();
  } finally {
    jobsLoading -= 1;
  }
  if (jobsDirty && jobsLoading === 0) { jobsDirty = false; refetchSoon("jobs-now", loadJobs, 50); }
}

async function loadJobsPage() {
  const f = jobFilter();
  const q = new URLSearchParams({ limit: String(PAGE) });
  for (const k of ["state", "user", "queue"]) if (f[k]) q.set(k, f[k]);
  const cursor = ui.jobCursors[ui.jobCursors.length - 1];
  if (cursor) q.set("cursor", cursor);
  const env = await api("GET", "/jobs?" + q.toString());
  fillRows($("jobs"), ui.jobs, env.data, "jobid", jobRow);
  ui.jobNext = env.next;
  $("jobs-page").textContent = `page ${ui.jobCursors.length}` + (env.data.length ? "" : " (no jobs)");
  $("jobs-next").disabled = !env.next;
  $("jobs-prev").disabled = ui.jobCursors.length < 2;
}

function onJobs(d) {
  if (burst(d, "jobs", loadJobs)) {
    if (ui.detail !== null) refetchSoon("detail", () => showJob(ui.detail));
    return;
  }
  if (jobsLoading) jobsDirty = true;
  let fresh = false;
  for (const id of d.removed || []) if (ui.jobs.has(id)) fresh = true;
  for (const j of d.items) {
    if (ui.detail === j.jobid) renderJob(j);  // whatever the list's filter
    const old = ui.jobs.get(j.jobid);
    if (old) {
      if (!matches(j)) { fresh = true; continue; }
      const tr = jobRow(j); old.replaceWith(tr); ui.jobs.set(j.jobid, tr);
    } else if (matches(j) && (ui.jobs.size < PAGE || !ui.jobNext)) {
      fresh = true;  // a new job that belongs on this page
    }
  }
  if (fresh) refetchSoon("jobs-now", loadJobs, 200);
}

async function showJob(jobid) {
  try {
    const env = await api("GET", "/jobs/" + jobid);
    renderJob(env.data[0]);
  } catch (e) {
    $("job-detail").hidden = false;
    $("jd-id").textContent = jobid;
    $("jd-timeline").replaceChildren(el("li", e.message, "error"));
  }
}

function renderJob(j) {
  ui.detail = j.jobid;
  $("job-detail").hidden = false;
  $("jd-id").textContent = String(j.jobid);
  const tl = $("jd-timeline"); tl.replaceChildren();
  tl.append(el("li", `submitted ${when(j.submit_time)} to queue ${j.queue} by ${j.user}`));
  if (j.start_time) {
    const hosts = (j.alloc || []).map((a) => `${a.host}\u00d7${a.ntasks}`).join(", ");
    tl.append(el("li", `started ${when(j.start_time)} on ${hosts || "-"}`));
  } else if (j.state === "PEND") {
    tl.append(el("li", "pending" + (j.pend_reason ? ": " + j.pend_reason : ""), "note"));
  }
  if (j.end_time) {
    let why = j.state;
    if (j.exit_status !== null && j.exit_status !== undefined) why += `, exit status ${j.exit_status}`;
    if (j.signal) why += `, signal ${j.signal}`;
    if (j.reason) why += `: ${j.reason}`;
    tl.append(el("li", `ended ${when(j.end_time)} (${why})`));
  }
  const dl = $("jd-fields"); dl.replaceChildren();
  for (const k of ["state", "name", "command", "project", "resreq", "ntasks", "attempt", "cwd"]) {
    dl.append(el("dt", k), el("dd", j[k] === null || j[k] === undefined || j[k] === "" ? "-" : j[k]));
  }
}

// Events: GET /events?since=SEQ (another part of the API; 404 where the server has none).
async function loadEvents(reset) {
  if (reset) { ui.eventsSeq = 0; $("events").replaceChildren(); }
  const kind = $("f-kind").value.trim();
  for (let pages = 0; pages < 10; pages++) {
    const q = new URLSearchParams({ since: String(ui.eventsSeq), limit: "200" });
    if (kind) q.set("kind", kind);
    let env;
    try {
      env = await api("GET", "/events?" + q.toString());
    } catch (e) {
      if (e.status === 404) {
        ui.eventsAvailable = false;
        $("events-note").textContent = "events not available on this server";
      } else {
        $("events-note").textContent = "events: " + e.message;
      }
      return;
    }
    ui.eventsAvailable = true;
    $("events-note").textContent = "";
    const body = $("events");
    for (const ev of env.data) {
      body.prepend(row([ev.seq, when(ev.time), ev.kind, ev.text || ""]));
      ui.eventsSeq = Math.max(ui.eventsSeq, ev.seq);
    }
    if (env.data.length < 200) break;
  }
}

// ------------------------------------------------------------------ the live stream
function setLive(on, text) {
  const b = $("live");
  b.className = "badge " + (on ? "on" : "off");
  b.textContent = text || (on ? "live" : "offline");
}

async function connect() {
  if (!ui.token) return;
  if (ui.stream) { ui.stream.close(); ui.stream = null; }
  let ticket;
  try {
    ticket = (await api("POST", "/stream/ticket")).data.ticket;
  } catch (e) {
    if (e.status === 401) return;
    setLive(false, "offline: " + e.message);
    return retry();
  }
  const es = new EventSource(PREFIX + "/stream?ticket=" + encodeURIComponent(ticket));
  ui.stream = es;
  const on = (name, fn) => es.addEventListener(name, (m) => {
    try { fn(JSON.parse(m.data)); } catch (e) { console.error("stream", name, e); }
  });
  // hello: take the stream's view of the primary, then the first view of every panel.
  on("hello", (d) => { ui.backoff = 1000; setLive(true); ui.server = d.server; onCluster(d); loadAll(); });
  on("cluster", onCluster);
  on("hosts", onHosts);
  on("queues", onQueues);
  on("jobs", onJobs);
  on("resync", () => loadAll());
  on("bye", (d) => { setLive(false, "offline: " + d.why); });
  // A ticket is single-use: on any error close, take a new ticket, re-fetch (in hello).
  es.onerror = () => { if (ui.stream === es) { es.close(); ui.stream = null; setLive(false); retry(); } };
}

function retry() {
  const wait = ui.backoff;
  ui.backoff = Math.min(ui.backoff * 2, 15000);
  setTimeout(connect, wait);
}

// ------------------------------------------------------------------ wiring
function wire() {
  $("signin-form").addEventListener("submit", signIn);
  $("logout").addEventListener("click", () => signOut("signed out"));
  window.addEventListener("hashchange", show);
  $("job-filter").addEventListener("submit", (ev) => { ev.preventDefault(); ui.jobCursors = [null]; loadJobs(); });
  $("jobs-first").addEventListener("click", () => { ui.jobCursors = [null]; loadJobs(); });
  $("jobs-next").addEventListener("click", () => { if (ui.jobNext) { ui.jobCursors.push(ui.jobNext); loadJobs(); } });
  $("jobs-prev").addEventListener("click", () => { if (ui.jobCursors.length > 1) { ui.jobCursors.pop(); loadJobs(); } });
  $("jd-close").addEventListener("click", () => { ui.detail = null; $("job-detail").hidden = true; });
  $("event-filter").addEventListener("submit", (ev) => { ev.preventDefault(); loadEvents(true); });
  if (ui.token) start(); else signOut();
}

document.addEventListener("DOMContentLoaded", wire);
