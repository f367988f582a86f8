// jobpool operations console: plain JavaScript over the admin REST API, no build step.
//
// Every action is a call of the REST API with the same token as curl would send, so the
// server's authorisation, tenant scope and audit apply unchanged. Data from the server is
// only ever written as text (textContent, never innerHTML): a payload holding markup shows
// as that markup, it is not parsed.
"use strict";

(() => {
  const TOKEN_KEY = "jobpool.token";
  const REFRESH_MS = 5000;
  const PAGE = 50;
  const OPEN_PAYLOAD_CHARS = 2000;   // larger payloads start collapsed
  const SUMMARY_CHARS = 120;         // an error or snapshot longer than this opens on a click

  const $ = (id) => document.getElementById(id);
  let principal = null;
  let refreshTimer = null;
  let confirmAction = null;

  // -- the API -----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  async function api(method, path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = {Accept: "application/json"};
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(path, {method, headers, cache: "no-store",
                                        credentials: "same-origin"});
    if (response.status === 204) return null;
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const detail = body && body.detail
        ? body.detail : `${response.status} ${response.statusText}`;
      if (response.status === 401 && principal) signedOut(`Signed out: ${detail}`);
      throw new ApiError(response.status, detail);
    }
    return body;
  }

  // -- building the page (text only) --------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "className") node.className = value;
      else if (name === "onclick") node.addEventListener("click", value);
      else if (name === "onchange") node.addEventListener("change", value);
      else if (value === true) node.setAttribute(name, "");
      else node.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // A heading made with num() is right-aligned, as its column's numbers are.
  function num(text) {
    return {num: text};
  }

  function table(headings, rows, emptyText) {
    if (!rows.length) return el("p", {className: "empty"}, emptyText);
    const heading = (h) => h !== null && typeof h === "object" && "num" in h
      ? el("th", {className: "num"}, h.num) : el("th", {}, h);
    return el("table", {},
      el("thead", {}, el("tr", {}, headings.map(heading))),
      el("tbody", {}, rows));
  }

  function fill(id, ...children) {
    $(id).replaceChildren(...children.flat());
  }

  function flash(text, kind) {
    const node = $("flash");
    node.textContent = text;
    node.className = kind || "info";
    node.hidden = !text;
  }

  function badge(status) {
    return el("span", {className: `badge status-${status}`}, status);
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function since(iso, now) {
    return iso ? duration(((now || Date.now()) - Date.parse(iso)) / 1000) : "";
  }

  // A time in the browser's zone, named (e.g. "12/1/2026, 9:14:03 PM UTC").
  function time(iso) {
    return iso ? new Date(iso).toLocaleString(undefined, {timeZoneName: "short"}) : "—";
  }

  // A time as above, with the exact instant in UTC on hover.
  function timeCell(iso, props) {
    return el("td", {...props, title: iso ? new Date(iso).toISOString() : null}, time(iso));
  }

  // Long text behind an expander: its first line (cut) as the summary, the whole text that
  // the API sent below, and a mark when the API sent only a preview of a longer text.
  function expander(text, cut, className) {
    const firstLine = text.split("\n", 1)[0];
    const short = firstLine.length > SUMMARY_CHARS
      ? `${firstLine.slice(0, SUMMARY_CHARS)}…` : firstLine;
    const mark = cut ? el("p", {className: "cut"}, cut) : null;
    if (!cut && short === text) return el("span", {className}, text);
    return el("details", {className: `expander ${className || ""}`},
      el("summary", {}, short), el("pre", {}, text), mark);
  }

  function jobLink(id) {
    return el("a", {href: `#/jobs/${id}`}, `#${id}`);
  }

  function json(value) {
    return JSON.stringify(value, null, 2);
  }

  // -- signing in ---------------------------------------------------------------------------

  function scopeText(tenants) {
    return tenants === "*" ? "all tenants" : `tenants: ${tenants.join(", ")}`;
  }

  async function signIn() {
    try {
      principal = await api("GET", "/v1/me");
    } catch (error) {
      principal = null;
      const token = sessionStorage.getItem(TOKEN_KEY);
      if (error.status === 403) {
        showLogin(`Refused: ${error.message}`);
      } else if (error.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(token ? `Refused: ${error.message}` : "");
      } else {
        showLogin(`The API did not answer: ${error.message}`);
      }
      return;
    }
    $("login").hidden = true;
    $("nav").hidden = false;
    $("who").hidden = false;
    $("who-sub").textContent = principal.sub;
    $("who-scope").textContent = scopeText(principal.tenants);
    // behind an auth proxy that injects the header there is no token here to forget
    $("sign-out").hidden = !sessionStorage.getItem(TOKEN_KEY);
    route();
  }

  function showLogin(message) {
    stopRefresh();
    for (const id of ["nav", "who", "view-overview", "view-dlq", "view-job"]) $(id).hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("login-error").hidden = !message;
  }

  function signedOut(message) {
    principal = null;
    sessionStorage.removeItem(TOKEN_KEY);
    flash("");
    showLogin(message);
  }

  // -- routing ------------------------------------------------------------------------------

  function parseHash() {
    const [path, query] = (location.hash.replace(/^#/, "") || "/overview").split("?");
    return {path, params: new URLSearchParams(query || "")};
  }

  function show(view) {
    for (const id of ["view-overview", "view-dlq", "view-job"]) $(id).hidden = id !== view;
    $("nav-overview").classList.toggle("current", view === "view-overview");
    $("nav-dlq").classList.toggle("current", view === "view-dlq");
  }

  function route() {
    if (!principal) return;
    stopRefresh();
    const {path, params} = parseHash();
    const job = path.match(/^\/jobs\/([0-9]{1,19})$/);
    if (path === "/dlq") {
      show("view-dlq");
      loadDlq(params);
    } else if (job) {
      show("view-job");
      loadJob(job[1]);
    } else {
      show("view-overview");
      loadOverview();
      refreshTimer = setInterval(loadOverview, REFRESH_MS);
    }
  }

  function stopRefresh() {
    if (refreshTimer !== null) clearInterval(refreshTimer);
    refreshTimer = null;
  }

  // -- overview -----------------------------------------------------------------------------

  async function loadOverview() {
    let data;
    try {
      data = await api("GET", "/v1/overview");
    } catch (error) {
      $("overview-updated").textContent = `Update failed: ${error.message}`;
      return;
    }
    const now = Date.parse(data.now);
    const pairs = new Map();
    for (const c of data.counts) {
      const key = `${c.tenant}\u0000${c.kind}`;
      if (!pairs.has(key)) {
        pairs.set(key, {tenant: c.tenant, kind: c.kind, pending: 0, ready: 0, age: 0,
                        running: 0, dlq: 0});
      }
      const p = pairs.get(key);
      p[c.status] = c.jobs;
      if (c.paused) p.paused = true;
      if (c.status === "pending") {
        p.ready = c.ready;
        p.age = c.ready_age_seconds;
      }
    }
    const dlqLink = (p) => p.dlq
      ? el("a", {href: `#/dlq?${new URLSearchParams({tenant: p.tenant, kind: p.kind})}`},
           String(p.dlq))
      : "0";
    fill("overview-counts", table(
      ["Tenant", "Kind", num("Pending"), num("Ready"), num("Oldest ready"), num("Running"),
       num("DLQ"), "Paused"],
      [...pairs.values()].map((p) => el("tr", {"data-pair": `${p.tenant} ${p.kind}`},
        el("td", {}, p.tenant), el("td", {}, p.kind), el("td", {className: "num"}, p.pending),
        el("td", {className: "num"}, p.ready),
        el("td", {className: p.age > 300 ? "num warn" : "num"}, p.ready ? duration(p.age) : ""),
        el("td", {className: "num"}, p.running), el("td", {className: "num"}, dlqLink(p)),
        el("td", {}, pairControl(p, data.paused)))),
      "No pending, running or DLQ jobs."));
    renderPauses(data.paused);
    renderLanes(data);
    fill("overview-limits", table(
      ["Tenant", "Kind", "Limit", num("Waiting"), "Next due"],
      data.rate_limits.map((r) => el("tr", {},
        el("td", {}, r.tenant), el("td", {}, r.kind),
        el("td", {}, `${r.rps}/s, burst ${r.burst}`),
        el("td", {className: "num"}, r.waiting),
        el("td", {}, r.next_due_at
          ? `in ${duration((Date.parse(r.next_due_at) - now) / 1000)}` : "—"))),
      "No tenant sets a rate limit."));
    const when = (at) => at === null ? "—" : new Date(at).toLocaleString();
    fill("overview-schedules", table(
      ["Schedule", "Kind", "Tenant", "When", "Last run", "Next run", num("Missed"), "Error"],
      data.schedules.map((s) => el("tr", {},
        el("td", {}, s.name), el("td", {}, s.kind), el("td", {}, s.tenant),
        el("td", {}, s.time_zone ? `${s.expression} (${s.time_zone})` : s.expression),
        el("td", {}, when(s.last_run_at)),
        el("td", {}, `${when(s.next_run_at)} (in ${
          duration(Math.max(0, (Date.parse(s.next_run_at) - now) / 1000))})`),
        el("td", {className: "num"}, s.missed_total),
        el("td", {className: s.last_error ? "warn" : ""}, s.last_error ?? ""))),
      "No schedules."));
    $("overview-updated").textContent =
      `Updated ${new Date().toLocaleTimeString(undefined, {timeZoneName: "short"})}.`;
  }

  // -- pause and resume ---------------------------------------------------------------------

  function scopeOf(p) {
    if (p.tenant !== null && p.kind !== null) return `tenant ${p.tenant}, kind ${p.kind}`;
    return p.kind !== null ? `kind ${p.kind} (every tenant)` : `tenant ${p.tenant} (every kind)`;
  }

  function scopeQuery(tenant, kind) {
    const query = new URLSearchParams();
    if (tenant) query.set("tenant", tenant);
    if (kind) query.set("kind", kind);
    return query;
  }

  // a pair's own pause can be resumed here; one held by a wider pause names that pause
  function pairControl(pair, paused) {
    const own = paused.find((p) => p.tenant === pair.tenant && p.kind === pair.kind);
    if (own) return el("button", {type: "button", className: "secondary",
                                  onclick: () => askResume(own)}, "Resume");
    const wider = paused.find((p) => (p.tenant === null || p.tenant === pair.tenant) &&
                                     (p.kind === null || p.kind === pair.kind));
    if (wider) return el("span", {className: "warn"}, `held: ${scopeOf(wider)}`);
    return el("button", {type: "button", className: "secondary",
                         onclick: () => fillPauseForm(pair.tenant, pair.kind)}, "Pause…");
  }

  function fillPauseForm(tenant, kind) {
    $("pause-tenant").value = tenant || "";
    $("pause-kind").value = kind || "";
    $("pause-reason").focus();
  }

  function renderPauses(paused) {
    const now = Date.now();
    fill("overview-paused", table(
      ["Tenant", "Kind", num("Pending"), num("Ready"), "Paused by", "Since", "Reason", ""],
      paused.map((p) => el("tr", {"data-pause": scopeOf(p)},
        el("td", {}, p.tenant === null ? "every tenant" : p.tenant),
        el("td", {}, p.kind === null ? "every kind" : p.kind),
        el("td", {className: "num"}, p.pending), el("td", {className: "num"}, p.ready),
        el("td", {}, p.paused_by), el("td", {}, `${since(p.paused_at, now)} ago`),
        el("td", {}, p.reason || "—"),
        el("td", {}, el("button", {type: "button", onclick: () => askResume(p)}, "Resume")))),
      "Nothing is paused."));
  }

  function askPause(event) {
    event.preventDefault();
    const tenant = $("pause-tenant").value.trim();
    const kind = $("pause-kind").value.trim();
    const reason = $("pause-reason").value.trim();
    if (!tenant && !kind) {
      flash("Name a tenant, a kind, or both to pause.", "error");
      return;
    }
    const query = scopeQuery(tenant, kind);
    if (reason) query.set("reason", reason);
    const scope = scopeOf({tenant: tenant || null, kind: kind || null});
    askConfirmation(
      `Pause ${scope}? Its ready jobs stay pending and no worker claims them until it is ` +
      `resumed; running jobs finish. The audit log records the pause as ${principal.sub}.`,
      "Pause", () => changePause("POST", query, `Paused ${scope}.`, () => {
        $("pause-form").reset();
      }));
  }

  function askResume(p) {
    askConfirmation(
      `Resume ${scopeOf(p)}? Workers claim its ready jobs again (a pair another pause holds ` +
      `stays paused). The audit log records the resume as ${principal.sub}.`,
      "Resume", () => changePause("DELETE", scopeQuery(p.tenant_id || p.tenant, p.kind),
                                  `Resumed ${scopeOf(p)}.`));
  }

  async function changePause(method, query, done, after) {
    try {
      await api(method, `/v1/pauses?${query}`);
      flash(done, "info");
      if (after) after();
    } catch (error) {
      flash(`Not done: ${error.message}`, "error");
    }
    loadOverview();
  }

  // -- lanes: live workers, running jobs and why a backlog waits ----------------------------

  function laneName(name) {
    return name === null ? "(no lane)" : name;
  }

  function served(lane) {
    if (!lane) return "";
    const kinds = lane.kinds === null
      ? `every other kind${lane.exclude_kinds.length
        ? ` (not ${lane.exclude_kinds.join(", ")})` : ""}`
      : lane.kinds.join(", ");
    return `${kinds}; tenants: ${lane.tenants.length ? lane.tenants.join(", ") : "all"}`;
  }

  function sizes(lane) {
    if (!lane) return "not in the pool file";
    const scaling = lane.autoscaling ? `, ${lane.autoscaling}` : "";
    return `${lane.workers_per_pod ?? "?"} per pod, ${lane.min_replicas ?? "?"}–` +
      `${lane.max_replicas ?? "?"} pods${scaling}`;
  }

  // `kind` in an explanation is shown as code; the rest as text
  function explained(text) {
    return text.split("`").map((part, i) => (i % 2 ? el("code", {}, part) : part));
  }

  function renderLanes(data) {
    const config = new Map(data.lanes.map((lane) => [lane.name, lane]));
    const stuck = data.activity.filter((a) => a.explanation !== null);
    fill("overview-stuck", stuck.length
      ? el("ul", {}, stuck.map((a) => el("li", {"data-lane": laneName(a.lane)},
        el("strong", {}, `${laneName(a.lane)}: `), explained(a.explanation))))
      : []);
    fill("overview-lanes", table(
      ["Lane", "Serves", "Live workers", "Busy slots", "Free slots", "Claims/min", "Done/min",
       "Ready", "Paused", "Oldest ready waits", "Why it waits", "Configured"],
      data.activity.map((a) => el("tr", {"data-lane": laneName(a.lane)},
        el("td", {}, laneName(a.lane)),
        el("td", {}, served(config.get(a.lane))),
        el("td", {className: a.workers ? "num" : "num warn"}, a.workers),
        el("td", {className: "num"}, `${a.busy} of ${a.slots}`),
        el("td", {className: a.free || !a.ready ? "num" : "num warn"}, a.free),
        el("td", {className: "num"}, a.claims_per_minute),
        el("td", {className: "num"}, a.completions_per_minute),
        el("td", {className: "num"}, a.ready),
        el("td", {className: a.paused ? "num warn" : "num"}, a.paused),
        el("td", {className: a.oldest_ready && a.oldest_ready.wait_seconds > 300
                    ? "num warn" : "num"},
           a.oldest_ready ? `${duration(a.oldest_ready.wait_seconds)} (` +
             `${a.oldest_ready.tenant} ${a.oldest_ready.kind})` : ""),
        el("td", {className: "explanation"}, a.explanation ? explained(a.explanation) : "—"),
        el("td", {}, sizes(config.get(a.lane))))),
      "No pool file configured and no live worker (jobpool api --pool FILE shows its lanes)."));
    fill("overview-running", table(
      ["Job", "Kind", "Tenant", "Lane", "Running for", "Holder"],
      data.running.map((j) => el("tr", {"data-job": j.id},
        el("td", {}, jobLink(j.id)), el("td", {}, j.kind), el("td", {}, j.tenant),
        el("td", {}, j.holder_live ? laneName(j.lane) : "—"),
        el("td", {className: "num"}, duration(j.age_seconds)),
        el("td", {}, j.holder, j.holder_live ? "" : el("span", {className: "dead",
          title: "no heartbeat: stale-claim recovery takes the job back"}, " (not live)")))),
      "No running jobs."));
    const now = Date.parse(data.now);
    fill("overview-workers", table(
      ["Worker", "Lane", "Kinds", "Tenants", "Busy slots", "Last claim", "Heartbeat", "Up for"],
      data.workers.map((w) => el("tr", {"data-worker": w.worker_id},
        el("td", {title: w.worker_id}, `${w.host} pid ${w.pid}`),
        el("td", {}, laneName(w.lane)),
        el("td", {}, w.kinds.join(", ")),
        el("td", {}, w.tenants.length ? w.tenants.join(", ") : "all"),
        el("td", {className: "num"}, `${w.busy_slots} of ${w.slots}`),
        el("td", {}, w.last_claim_at ? `${since(w.last_claim_at, now)} ago` : "never"),
        el("td", {}, `${since(w.heartbeat_at, now)} ago`),
        el("td", {}, since(w.started_at, now)))),
      "No live worker: none has sent a heartbeat in the last 30 seconds."));
  }

  // -- DLQ ----------------------------------------------------------------------------------

  let dlqState = {params: new URLSearchParams(), items: [], nextAfter: null};

  function selectedIds() {
    return [...document.querySelectorAll("#dlq-table input.pick:checked")]
      .map((box) => Number(box.value));
  }

  function updateSelection() {
    const n = selectedIds().length;
    for (const [id, verb] of [["dlq-replay-selected", "Replay"],
                              ["dlq-discard-selected", "Discard"]]) {
      $(id).disabled = n === 0;
      $(id).textContent = n ? `${verb} selected (${n})` : `${verb} selected`;
    }
  }

  async function loadDlq(params) {
    $("dlq-tenant").value = params.get("tenant") || "";
    $("dlq-kind").value = params.get("kind") || "";
    const query = new URLSearchParams({limit: String(PAGE)});
    for (const name of ["tenant", "kind", "after"]) {
      if (params.get(name)) query.set(name, params.get(name));
    }
    let page;
    try {
      page = await api("GET", `/v1/dlq?${query}`);
    } catch (error) {
      fill("dlq-table", el("p", {className: "error"}, error.message));
      $("dlq-next").hidden = $("dlq-first").hidden = true;
      updateSelection();
      return;
    }
    dlqState = {params, items: page.items, nextAfter: page.next_after};
    const pickAll = el("input", {type: "checkbox", "aria-label": "select all",
                                 onchange: (event) => {
      for (const box of document.querySelectorAll("#dlq-table input.pick")) {
        box.checked = event.target.checked;
      }
      updateSelection();
    }});
    const rows = page.items.map((job) => el("tr", {"data-job": job.id},
      el("td", {}, el("input", {type: "checkbox", className: "pick", value: job.id,
                                "aria-label": `select job ${job.id}`, onchange: updateSelection})),
      el("td", {}, jobLink(job.id)),
      el("td", {}, job.job_kind),
      el("td", {}, job.tenant_key),
      el("td", {className: "num"}, `${job.attempts}/${job.max_attempts}`),
      el("td", {className: "error-text"}, lastError(job)),
      el("td", {className: "num",
                title: `in the DLQ since ${time(job.dlq_at)}; created ${time(job.created_at)}`},
         since(job.dlq_at)),
      el("td", {className: "row-actions"},
         el("button", {type: "button", onclick: () => askReplay([job.id])}, "Replay"),
         el("button", {type: "button", className: "danger",
                       onclick: () => askDiscard([job.id])}, "Discard"))));
    fill("dlq-table", table(
      [pickAll, "Job", "Kind", "Tenant", num("Attempts"), "Last error", num("In the DLQ for"),
       ""], rows,
      "The DLQ is empty for this filter."));
    $("dlq-next").hidden = page.next_after === null;
    $("dlq-first").hidden = !params.get("after");
    updateSelection();
  }

  // A DLQ row's last error: what the list sent (a bounded preview where the API sends
  // one), marked when the job holds more.
  function lastError(job) {
    const text = job.last_error_preview ?? job.last_error ?? "";
    const cut = job.last_error_truncated
      ? `Cut at ${text.length.toLocaleString()} of ` +
        `${(job.last_error_length ?? 0).toLocaleString()} characters: job #${job.id}'s ` +
        "page shows it whole."
      : "";
    return expander(text, cut, "error-text");
  }

  function dlqHash(params) {
    const query = new URLSearchParams();
    for (const [name, value] of params) if (value) query.set(name, value);
    const text = query.toString();
    return text ? `#/dlq?${text}` : "#/dlq";
  }

  function jobList(ids) {
    if (ids.length === 1) return `job #${ids[0]}`;
    return `${ids.length} jobs (${ids.map((id) => `#${id}`).join(", ")})`;
  }

  function each(ids) {
    return ids.length === 1 ? "It" : "Each";
  }

  function askReplay(ids, after) {
    askConfirmation(
      `Replay ${jobList(ids)}? ${each(ids)} goes back to pending with attempts 0 and runs ` +
      `again when a worker is free. The audit log records the replay as ${principal.sub}.`,
      "Replay", () => runAll(ids, "POST", (id) => `/v1/jobs/${id}/replay`, "Replayed", after));
  }

  function askDiscard(ids, after) {
    askConfirmation(
      `Discard ${jobList(ids)}? ${each(ids)} is deleted for good; the audit log keeps a ` +
      `snapshot of it and records the discard as ${principal.sub}.`,
      "Discard", () => runAll(ids, "DELETE", (id) => `/v1/jobs/${id}`, "Discarded", after));
  }

  function askStop(id) {
    askConfirmation(
      `Stop job #${id}? It is flagged failed and no worker runs it again; a worker running ` +
      `it now interrupts its handler and its writes are rolled back. The audit log records the ` +
      `stop as ${principal.sub}.`,
      "Stop", () => runAll([id], "POST", (j) => `/v1/jobs/${j}/stop`, "Stopped"));
  }

  async function runAll(ids, method, path, done, after) {
    const ok = [];
    const failed = [];
    for (const id of ids) {
      try {
        await api(method, path(id));
        ok.push(id);
      } catch (error) {
        failed.push(`#${id}: ${error.message}`);
      }
    }
    const parts = [];
    if (ok.length) parts.push(`${done} ${jobList(ok)}.`);
    if (failed.length) parts.push(`Not done: ${failed.join("; ")}`);
    flash(parts.join(" "), failed.length ? "error" : "info");
    if (after) after(ok);
    else route();
  }

  // -- confirmation -------------------------------------------------------------------------

  function askConfirmation(text, verb, action) {
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = verb;
    $("confirm-ok").className = ["Replay", "Resume"].includes(verb) ? "" : "danger";
    confirmAction = action;
    $("confirm").showModal();
  }

  // -- job detail ---------------------------------------------------------------------------

  function field(name, value) {
    return [el("dt", {}, name), el("dd", {}, value === null || value === undefined ? "—" : value)];
  }

  function jsonBlock(title, value) {
    const text = json(value);
    return el("details", {className: "json", open: text.length <= OPEN_PAYLOAD_CHARS},
      el("summary", {}, `${title} (${text.length.toLocaleString()} characters)`),
      el("pre", {}, text));
  }

  async function loadJob(id) {
    fill("job-actions");
    $("job-title").textContent = `Job #${id}`;
    let job = null;
    let history = [];
    let missing = "";
    try {
      job = await api("GET", `/v1/jobs/${id}`);
    } catch (error) {
      if (error.status !== 404) {
        fill("job-body", el("p", {className: "error"}, error.message));
        return;
      }
      missing = error.message;
    }
    try {
      history = (await api("GET", `/v1/audit/jobs/${id}`)).items;
    } catch (error) {
      if (!job) {
        fill("job-body", el("p", {className: "error"}, missing));
        return;
      }
    }
    const body = [];
    if (job) {
      $("job-title").replaceChildren(`Job #${id} · ${job.job_kind} · `, badge(job.status));
      const buttons = [];
      if (job.status === "dlq") {
        buttons.push(el("button", {type: "button", onclick: () => askReplay([job.id])}, "Replay"));
      }
      if (["pending", "running", "dlq"].includes(job.status)) {
        buttons.push(el("button", {type: "button", className: "danger",
                                   onclick: () => askStop(job.id)}, "Stop"));
      }
      if (["dlq", "failed"].includes(job.status)) {
        buttons.push(el("button", {type: "button", className: "danger",
                                   onclick: () => askDiscard([job.id], () => route())}, "Discard"));
      }
      fill("job-actions", buttons);
      body.push(el("dl", {className: "fields"},
        field("Tenant", `${job.tenant_key} (${job.tenant_id})`),
        field("Kind", job.job_kind),
        field("Status", badge(job.status)),
        field("Attempts", `${job.attempts} of ${job.max_attempts}`),
        field("Priority", job.priority),
        field("Created", time(job.created_at)),
        field("Available at", time(job.available_at)),
        field("Completed", time(job.completed_at)),
        field("Idempotency key", job.idempotency_key)));
      if (job.status === "running") {
        body.push(el("h2", {}, "Claim"), el("dl", {className: "fields"},
          field("Worker", job.claimed_by),
          field("Claimed", time(job.claimed_at)),
          field("Lease renewed", time(job.heartbeat_at || job.claimed_at))));
      }
      body.push(el("h2", {}, "Last error"),
                job.last_error ? el("pre", {className: "error-text"}, job.last_error)
                               : el("p", {className: "empty"}, "None."));
      body.push(el("h2", {}, "Payload"), jsonBlock("Payload", job.payload));
      if (job.result !== null && job.result !== undefined) {
        body.push(el("h2", {}, "Result"), jsonBlock("Result", job.result));
      }
    } else {
      body.push(el("p", {className: "empty"}, `${missing}. Its audit history remains:`));
    }
    body.push(el("h2", {}, "History"), table(["When", "Action", "Actor", "Details"],
      history.map((row) => el("tr", {"data-action": row.action},
        timeCell(row.at), el("td", {}, row.action), actorCell(row),
        el("td", {}, historyDetails(row)))),
      "No audit rows."));
    fill("job-body", body);
  }

  // Who did it, and what kind of principal that is (a person at the command line, an admin
  // API token's subject, a service account such as the workers').
  function actorCell(row) {
    const kind = row.actor_kind || "service account";
    return el("td", {className: "actor"}, row.actor_name ?? row.actor, " ",
              el("span", {className: `badge actor-${kind.replace(" ", "-")}`}, kind));
  }

  // An audit row's payload: the object when the API sent it whole, else the preview's text.
  function auditPayload(row) {
    if (!("payload_preview" in row)) return {value: row.payload, text: json(row.payload), cut: ""};
    if (row.payload_preview === null) {
      return {value: null, text: "",
              cut: `${(row.payload_size ?? 0).toLocaleString()} bytes stored, not shown here.`};
    }
    if (!row.payload_truncated) {
      const value = JSON.parse(row.payload_preview);
      return {value, text: json(value), cut: ""};
    }
    return {value: null, text: row.payload_preview,
            cut: `Cut at ${row.payload_preview.length.toLocaleString()} characters of ` +
                 `${(row.payload_size ?? 0).toLocaleString()} bytes stored.`};
  }

  // What an audit row says: an attempt's error for a retry or the DLQ, a discard's snapshot
  // of the job, else its payload; long ones behind an expander.
  function historyDetails(row) {
    const {value, text, cut} = auditPayload(row);
    if (value && row.action === "job_retry") {
      return [el("span", {}, `Attempt ${value.attempt} failed; retried in ` +
                             `${duration(value.delay_seconds)}: `),
              expander(String(value.error ?? ""), "", "error-text")];
    }
    if (value && row.action === "job_dlq") {
      return [el("span", {}, `Attempt ${value.attempts} failed; moved to the DLQ: `),
              expander(String(value.last_error ?? ""), "", "error-text")];
    }
    if (value && row.action === "job_discard") {
      return [el("span", {}, "Deleted; the job as it was: "), expander(text, cut, "snapshot")];
    }
    return expander(value ? JSON.stringify(value) : text, cut, "snapshot");
  }

  // -- wiring -------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim().replace(/^Bearer\s+/i, "");
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token").value = "";
      signIn();
    });
    $("sign-out").addEventListener("click", () => signedOut(""));
    $("dlq-filter").addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = dlqHash([["tenant", $("dlq-tenant").value.trim()],
                               ["kind", $("dlq-kind").value.trim()]]);
    });
    $("dlq-clear").addEventListener("click", () => { location.hash = "#/dlq"; });
    $("pause-form").addEventListener("submit", askPause);
    $("dlq-next").addEventListener("click", () => {
      const params = new URLSearchParams(dlqState.params);
      params.set("after", String(dlqState.nextAfter));
      location.hash = dlqHash(params);
    });
    $("dlq-first").addEventListener("click", () => {
      const params = new URLSearchParams(dlqState.params);
      params.delete("after");
      location.hash = dlqHash(params);
    });
    $("dlq-replay-selected").addEventListener("click", () => askReplay(selectedIds()));
    $("dlq-discard-selected").addEventListener("click", () => askDiscard(selectedIds()));
    $("confirm-cancel").addEventListener("click", () => {
      confirmAction = null;
      $("confirm").close();
    });
    $("confirm-ok").addEventListener("click", () => {
      const action = confirmAction;
      confirmAction = null;
      $("confirm").close();
      if (action) action();
    });
    window.addEventListener("hashchange", () => {
      flash("");
      route();
    });
    signIn();
  });
})();
