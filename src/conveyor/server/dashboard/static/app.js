// Conveyor dashboard: actions through the /v1 API, live updates from the SSE streams.
"use strict";

// Where the dashboard is mounted ("" at the root, "/queue" under a prefix):
// every path below is the app's own, under it.
const ROOT = document.body.dataset.root || "";

async function api(method, path, body) {
  const headers = { "X-Conveyor-Dashboard": "1", Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(ROOT + path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  return { ok: res.ok, status: res.status, data };
}

function detail(r) {
  const d = r.data && r.data.detail;
  if (!d) return `HTTP ${r.status}`;
  if (typeof d === "string") return d;
  return d.map((e) => `${(e.loc || []).filter((x) => x !== "body").join(".")}: ${e.msg}`).join("; ");
}

function flash(message, bad) {
  const box = document.getElementById("flash");
  const div = document.createElement("div");
  div.textContent = message;
  if (bad) div.className = "bad";
  box.appendChild(div);
  setTimeout(() => div.remove(), bad ? 9000 : 4000);
}

async function act(label, method, path, body) {
  const r = await api(method, path, body);
  if (r.ok) {
    flash(`${label}: done`);
    setTimeout(() => location.reload(), 600);
  } else {
    flash(`${label}: refused (${r.status}) ${detail(r)}`, true);
  }
  return r;
}

document.addEventListener("click", async (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.dataset.action && b.dataset.queue) {
    const q = b.dataset.queue, what = b.dataset.action;
    if (!confirm(`${what === "pause" ? "Pause" : "Resume"} queue "${q}"?`)) return;
    await act(`${what} ${q}`, "POST", `/v1/queues/${encodeURIComponent(q)}/${what}`);
  } else if (b.dataset.jobAction) {
    const id = b.dataset.job, what = b.dataset.jobAction;
    if (!confirm(`${what[0].toUpperCase() + what.slice(1)} job ${id}?`)) return;
    if (what === "delete") {
      const r = await act(`delete job ${id}`, "DELETE", `/v1/jobs/${id}`);
      if (r.ok) setTimeout(() => (location.href = ROOT + "/jobs"), 300);
    } else {
      await act(`${what} job ${id}`, "POST", `/v1/jobs/${id}/${what}`);
    }
  } else if (b.dataset.batchAction) {
    const id = b.dataset.batchId, what = b.dataset.batchAction;
    if (!confirm(`${what === "cancel" ? "Cancel batch" : "Retry the failed jobs of batch"} ${id}?`)) return;
    await act(`${what} batch ${id}`, "POST", `/v1/batches/${id}/${what}`);
  } else if (b.dataset.workflowAction) {
    const id = b.dataset.workflowId, what = b.dataset.workflowAction;
    if (!confirm(`${what === "cancel" ? "Cancel workflow" : "Run the failed, cancelled and skipped nodes again of workflow"} ${id}?`)) return;
    await act(`${what} workflow ${id}`, "POST", `/v1/workflows/${id}/${what}`);
  } else if (b.dataset.bulk) {
    const box = b.closest("[data-filter]");
    const filter = JSON.parse(box.dataset.filter);
    const what = b.dataset.bulk;
    const dry = await api("POST", `/v1/jobs/bulk-${what}`, { ...filter, dry_run: true });
    if (!dry.ok) { flash(`${what}: refused (${dry.status}) ${detail(dry)}`, true); return; }
    const n = dry.data.matched;
    if (!n) { flash(`${what}: no job matching this filter can be changed`); return; }
    if (!confirm(`${what} ${n} job(s) matching this filter (every page, not only this one)?`)) return;
    b.disabled = true;
    const started = await api("POST", `/v1/jobs/bulk-${what}`, { ...filter, background: true });
    if (!started.ok) { b.disabled = false; flash(`${what}: refused (${started.status}) ${detail(started)}`, true); return; }
    const status = document.createElement("span");
    status.className = "bulk-status";
    b.parentElement.appendChild(status);
    const poll = async () => {
      const r = await api("GET", `/v1/actions/${started.data.id}`);
      if (!r.ok) { status.textContent = `lost track of it (${r.status})`; return; }
      const a = r.data;
      status.textContent = ` ${a.action}: ${a.done} of ${a.matched} ${a.state === "running" ? "…" : a.state}`;
      if (a.state === "running") { setTimeout(poll, 500); return; }
      b.disabled = false;
      if (a.state === "failed") flash(`${what} failed: ${a.error}`, true);
      else {
        flash(`${what}: ${a.done} done${a.requested ? `, ${a.requested} running asked to stop` : ""} (see Actions)`);
        setTimeout(() => location.reload(), 1500);
      }
    };
    poll();
  }
});

// -- forms -------------------------------------------------------------------------
document.addEventListener("submit", async (ev) => {
  const form = ev.target;
  if (form.id === "trigger") {
    ev.preventDefault();
    form.querySelectorAll(".field-error").forEach((e) => (e.textContent = ""));
    const show = (field, msg) => {
      const el = form.querySelector(`.field-error[data-field="${field}"]`) || form.querySelector('.field-error[data-field="args"]');
      el.textContent = msg;
    };
    const f = new FormData(form);
    const body = { task: f.get("task").trim() };
    for (const key of ["args", "kwargs"]) {
      try { body[key] = JSON.parse(f.get(key) || (key === "args" ? "[]" : "{}")); }
      catch (e) { show(key, `not valid JSON: ${e.message}`); return; }
    }
    if (f.get("queue")) body.queue = f.get("queue").trim();
    if (f.get("priority") !== "") body.priority = Number(f.get("priority"));
    if (f.get("delay")) body.delay = Number(f.get("delay"));
    const r = await api("POST", "/v1/jobs", body);
    const out = document.getElementById("trigger-result");
    if (r.ok) {
      out.innerHTML = "";
      const a = document.createElement("a");
      a.href = `${ROOT}/jobs/${r.data.id}`;
      a.textContent = `job ${r.data.id} sent (${r.data.state})`;
      out.appendChild(a);
    } else if (Array.isArray(r.data && r.data.detail)) {
      for (const e of r.data.detail) show((e.loc || [])[1] || "args", e.msg);
    } else {
      const msg = detail(r);
      const field = /queue/i.test(msg) && !/argument/i.test(msg) ? "queue" : /no task|task name|unknown task/i.test(msg) ? "task" : "args";
      show(field, msg);
    }
  } else if (form.classList.contains("task-settings")) {
    ev.preventDefault();
    const err = form.querySelector(".field-error");
    err.textContent = "";
    let body;
    try { body = JSON.parse(form.settings.value || "{}"); }
    catch (e) { err.textContent = `not valid JSON: ${e.message}`; return; }
    const r = await api("PATCH", `/v1/tasks/${encodeURIComponent(form.dataset.task)}/settings`, body);
    if (r.ok) { flash(`settings of ${form.dataset.task} saved`); setTimeout(() => location.reload(), 600); }
    else err.textContent = detail(r);
  }
});

// -- live updates ----------------------------------------------------------------------
function paint(bar, p) {
  const pct = Math.round(p.percent || 0);
  bar.querySelector("div").style.width = `${pct}%`;
  bar.querySelector("span").textContent = `${pct}%`;
  bar.dataset.state = p.state;
  const row = bar.closest("[data-batch-row]");
  const badge = row ? row.querySelector('[data-field="state"]') : document.getElementById("batch-state");
  if (badge && p.state) { badge.textContent = p.state; badge.className = `badge ${p.state}`; }
  if (bar.hasAttribute("data-live")) {
    document.querySelectorAll("[data-count]").forEach((td) => {
      const v = p[td.dataset.count];
      if (v !== undefined) td.textContent = v === null ? "-" : v;
    });
  }
}

function followBatch(bar) {
  if (bar.dataset.state !== "running" && bar.dataset.state !== "open") return;
  const src = new EventSource(`${ROOT}/v1/batches/${bar.dataset.batch}/events`);
  src.addEventListener("batch.progress", (e) => paint(bar, JSON.parse(e.data)));
  src.addEventListener("batch.closed", (e) => {
    const d = JSON.parse(e.data);
    paint(bar, { ...(d.progress || {}), percent: 100, state: d.state });
    src.close();
  });
}

function followOverview() {
  if (!document.getElementById("live")) return;
  let timer = null;
  const refresh = async () => {
    timer = null;
    const res = await fetch(location.href, { credentials: "same-origin" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    document.querySelector("main").replaceWith(doc.querySelector("main"));
  };
  const src = new EventSource(ROOT + "/v1/events");
  src.onmessage = null;
  const poke = () => { if (!timer) timer = setTimeout(refresh, 2000); };
  for (const kind of ["job.created", "job.started", "job.succeeded", "job.failed", "job.retried", "job.cancelled", "batch.closed"]) {
    src.addEventListener(kind, poke);
  }
  setInterval(poke, 15000);  // heartbeats age, workers go silent: refresh now and then anyway
}

function followBatchList() {
  // one stream for the whole list (a browser opens at most six connections per server)
  const bars = {};
  document.querySelectorAll(".bar[data-batch]:not([data-live])").forEach((b) => (bars[b.dataset.batch] = b));
  if (!Object.values(bars).some((b) => b.dataset.state === "running")) return;
  const src = new EventSource(ROOT + "/v1/events");
  src.addEventListener("batch.progress", (e) => {
    const d = JSON.parse(e.data);
    if (bars[d.batch_id]) paint(bars[d.batch_id], d);
  });
  src.addEventListener("batch.closed", (e) => {
    const d = JSON.parse(e.data);
    if (bars[d.id]) paint(bars[d.id], { percent: 100, state: d.state });
  });
}

// The workflow page: each node event repaints its box (class, status line, the
// map's bar) and its row; the run's end reloads the page (results, errors).
function statusText(n) {
  const c = n.item_counts;
  if (!c || n.items === null) return n.state;
  return `${n.state} · ${c.succeeded}/${n.items} succeeded${c.failed ? `, ${c.failed} failed` : ""}`;
}

function paintNode(svg, n) {
  const g = svg && svg.querySelector(`g[data-node="${n.node}"]`);
  if (g) {
    g.setAttribute("class", `node ${n.kind} state-${n.state}`);
    g.querySelector("text.status").textContent = statusText(n);
    const done = g.querySelector("rect.done"), bad = g.querySelector("rect.bad");
    if (done && n.items) {
      const full = Number(g.querySelector("rect.track").getAttribute("width"));
      const ok = (full * n.item_counts.succeeded) / n.items;
      done.setAttribute("width", ok.toFixed(1));
      bad.setAttribute("x", (10 + ok).toFixed(1));
      bad.setAttribute("width", ((full * n.item_counts.failed) / n.items).toFixed(1));
    }
  }
  const row = document.querySelector(`tr[data-node-row="${n.node}"]`);
  if (row) {
    const badge = row.querySelector('[data-field="state"]');
    badge.textContent = n.state;
    badge.className = `badge ${n.state}`;
    if (n.item_counts) row.querySelector('[data-field="items"]').textContent = `${n.item_counts.succeeded}/${n.items}`;
  }
}

function followWorkflow() {
  const svg = document.getElementById("graph");
  const badge = document.getElementById("workflow-state");
  if (!badge || badge.textContent.trim() !== "running") return;
  const id = location.pathname.split("/").pop();
  const src = new EventSource(`${ROOT}/v1/workflows/${id}/events`);
  src.addEventListener("node", (e) => paintNode(svg, JSON.parse(e.data)));
  src.addEventListener("workflow", (e) => {
    const w = JSON.parse(e.data);
    badge.textContent = w.state;
    badge.className = `badge ${w.state}`;
    if (svg) svg.dataset.state = w.state;
    if (w.state !== "running") {
      src.close();
      setTimeout(() => location.reload(), 800);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  // widths are set here, not in style attributes: the Content-Security-Policy allows no inline style
  document.querySelectorAll(".bar[data-percent] > div").forEach((d) => (d.style.width = `${d.parentElement.dataset.percent}%`));
  document.querySelectorAll(".bar[data-batch][data-live]").forEach(followBatch);
  followBatchList();
  followOverview();
  followWorkflow();
});
