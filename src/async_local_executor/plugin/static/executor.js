// The executor page: polls ./status (authenticated) every 2 s, or ./health when the user is not
// logged in, and redraws. Everything a DAG controls (task names, reasons) goes in as text, never HTML.

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

// Airflow's UI frames this page and keeps its colour mode as a class on its <html>; followed live, so
// switching the theme in Airflow switches this page too. Opened on its own, the browser's preference.
function followColourMode() {
  const root = document.documentElement;
  let host = null;
  try {
    host = window.parent !== window ? window.parent.document.documentElement : null;
  } catch {
    host = null; // framed by another origin: its document is not ours to read
  }
  const media = window.matchMedia("(prefers-color-scheme: dark)");
  const apply = () => {
    const dark = host ? host.classList.contains("dark") : media.matches;
    root.classList.toggle("dark", dark);
  };
  apply();
  if (host) {
    new MutationObserver(apply).observe(host, { attributes: true, attributeFilter: ["class"] });
  } else {
    media.addEventListener("change", apply);
  }
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function number(value, digits = 0) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "-";
}

function setVerdict(verdict, updated) {
  const badge = document.getElementById("verdict");
  badge.textContent = verdict;
  badge.className = `verdict ${verdict}`;
  document.getElementById("updated").textContent = updated;
}

function fillReasons(list, reasons) {
  list.replaceChildren(...(reasons || []).map((reason) => el("li", reason)));
}

function row(cells, classes = []) {
  const tr = document.createElement("tr");
  cells.forEach((cell, i) => tr.append(el("td", cell, classes[i])));
  return tr;
}

function emptyRow(tbody, columns, text) {
  const tr = document.createElement("tr");
  tr.className = "empty";
  const td = el("td", text);
  td.colSpan = columns;
  tr.append(td);
  tbody.replaceChildren(tr);
}

function chart(container, history, now) {
  // Drawn at the container's own width: a scaled viewBox would stretch the labels with the page.
  const width = Math.max(320, container.clientWidth || 720);
  const height = 160;
  const left = 36;
  const bottom = 20;
  const span = 600; // seconds shown: the status file keeps ten minutes
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "running and waiting workloads over the last ten minutes");
  const samples = (history || []).filter((s) => Array.isArray(s) && s.length === 3);
  const top = Math.max(1, ...samples.map((s) => Math.max(s[1], s[2])));
  const x = (t) => left + ((t - (now - span)) / span) * (width - left - 4);
  const y = (v) => height - bottom - (v / top) * (height - bottom - 14);
  const line = (x1, y1, x2, y2, cls) => {
    const l = document.createElementNS(SVG, "line");
    Object.entries({ x1, y1, x2, y2 }).forEach(([k, v]) => l.setAttribute(k, v));
    l.setAttribute("class", cls);
    svg.append(l);
  };
  const text = (tx, ty, value, anchor = "start") => {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", tx);
    t.setAttribute("y", ty);
    t.setAttribute("text-anchor", anchor);
    t.textContent = value;
    return t;
  };
  const grid = document.createElementNS(SVG, "g");
  grid.setAttribute("class", "grid");
  grid.append(text(left - 6, y(top) + 4, String(top), "end"), text(left - 6, y(0) + 4, "0", "end"));
  for (let m = 10; m >= 0; m -= 2) {
    grid.append(text(x(now - m * 60), height - 4, m ? `-${m} min` : "now", m ? "middle" : "end"));
  }
  svg.append(grid);
  line(left, y(0), width - 4, y(0), "axis");
  line(left, y(top), width - 4, y(top), "axis");
  for (const [index, name] of [[1, "running"], [2, "waiting"]]) {
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", name);
    path.setAttribute(
      "points",
      samples.filter((s) => s[0] >= now - span).map((s) => `${x(s[0]).toFixed(1)},${y(s[index]).toFixed(1)}`).join(" "),
    );
    svg.append(path);
  }
  const legend = document.createElementNS(SVG, "g");
  legend.setAttribute("class", "legend");
  [["running", 0], ["waiting", 90]].forEach(([name, offset]) => {
    const swatch = document.createElementNS(SVG, "rect");
    Object.entries({ x: left + 8 + offset, y: 2, width: 10, height: 10 }).forEach(([k, v]) => swatch.setAttribute(k, v));
    swatch.setAttribute("class", `swatch ${name}`);
    legend.append(swatch, text(left + 22 + offset, 11, name));
  });
  svg.append(legend);
  container.replaceChildren(svg);
}

// What the fork server imports beyond every task's needs: the modules, and the refusals with why (hover).
function preloadText(preload) {
  if (!preload) return ["-", ""];
  if (preload.mode === "explicit") return [`${(preload.modules || []).join(", ") || "nothing"} (preload_modules)`, ""];
  const names = (preload.preloaded || []).map((p) => p.module);
  const refused = preload.refused || [];
  const text = `${names.length ? names.join(", ") : "nothing yet"} (learned)${refused.length ? `; ${refused.length} refused` : ""}`;
  return [text, refused.map((r) => `${r.module}: ${r.reason}`).join("\n")];
}

function outcomeClass(outcome) {
  return outcome === "ok" ? "outcome-ok" : "outcome-bad";
}

function drawExecutor(data, now) {
  const section = document.getElementById("executor").content.firstElementChild.cloneNode(true);
  const q = (selector) => section.querySelector(selector);
  const team = data.team ? `, team ${data.team}` : "";
  const state = data.gone ? "stopped" : data.stale ? "stale" : data.verdict;
  q(".title").textContent = `${data.hostname}: scheduler pid ${data.pid}${team} (${state})`;
  fillReasons(q(".instance-reasons"), data.reasons);
  drawControl(section, data);
  const running = data.running || [];
  q(".slots").textContent = `${running.length} / ${data.parallelism ?? "-"}`;
  q(".waiting").textContent = data.waiting ?? 0;
  q(".prefetched").textContent = data.prefetched ?? "-";
  q(".lag").textContent = number(data.loop_lag_ms, 1);
  q(".launcher").textContent = data.launcher_state || data.launcher || "-";
  const [preloaded, refusals] = preloadText(data.preload);
  q(".preload").textContent = preloaded;
  q(".preload").title = refusals;
  q(".containment").textContent = (data.containment && data.containment.detail) || "-";
  const memory = data.memory || {};
  const available = typeof memory.available_mb === "number" ? `${memory.available_mb} MB available, ` : "";
  q(".memory").textContent = !memory.floor_mb
    ? "off"
    : `${memory.guard_holding ? "holding workloads: " : ""}${available}floor ${memory.floor_mb} MB`;
  const fds = data.descriptors;
  q(".descriptors").textContent = !fds
    ? "-"
    : `${fds.holding ? "table full, launches held back: " : ""}${fds.open} open, limit ${fds.limit ?? "none"}`;
  q(".totals").textContent = Object.entries(data.totals || {})
    .map(([name, count]) => `${name} ${count}`)
    .join(", ");

  const numbers = [undefined, "number", "number", "number", "number", "number", "number"];
  const body = q("table.running tbody");
  if (running.length) {
    body.replaceChildren(
      ...running.map((w) =>
        row(
          [w.task + ({held: " (held for adoption)", adopted: " (adopted)"}[w.adoption] ?? ""), w.try ?? "-", w.pid, number(w.age_s), number(w.memory_mb, 1), number(w.peak_mb, 1), number(w.cpu_s, 1)],
          numbers,
        ),
      ),
    );
  } else {
    emptyRow(body, 7, "nothing running");
  }
  const finished = data.recent_finished || [];
  const done = q("table.finished tbody");
  if (finished.length) {
    done.replaceChildren(
      ...finished.map((f) => {
        const ended = new Date(f.at * 1000).toLocaleTimeString();
        return row(
          [ended, f.task, f.try ?? "-", f.outcome, f.returncode ?? "-", number(f.ran_s, 1), f.reason || ""],
          [undefined, undefined, "number", outcomeClass(f.outcome), "number", "number", undefined],
        );
      }),
    );
  } else {
    emptyRow(done, 7, "nothing finished yet");
  }
  return section;
}

// Live control: the state in force, who set it and when, and the buttons that change it (each asks for
// confirmation first, see ask()). Only a user Airflow lets change the configuration gets past the api-server.
function drawControl(section, data) {
  const live = data.control;
  const box = section.querySelector(".control");
  if (!live || data.gone || data.stale) {
    box.hidden = true;
    return;
  }
  const state = section.querySelector(".control-state");
  state.textContent = live.note || "running";
  state.className = `control-state mode-${live.mode}`;
  const queues = Object.entries(live.queue_limits || {})
    .map(([name, n]) => `${name}:${n} (configured ${(live.configured_queue_limits || {})[name] ?? "-"})`)
    .join(", ");
  section.querySelector(".control-limits").textContent =
    `parallelism ${live.parallelism} (configured ${live.configured_parallelism})${queues ? `, queues ${queues}` : ""}` +
    (live.overdue ? `; drain past its deadline, still running then: ${(live.still_running || []).join(", ") || "none"}` : "");
  const paused = live.mode !== "running";
  section.querySelector('[data-action="pause"]').disabled = paused;
  section.querySelector('[data-action="drain"]').disabled = live.mode === "draining" || live.mode === "drained";
  section.querySelector('[data-action="resume"]').disabled = !paused;
  section.querySelectorAll("button[data-action]").forEach((button) => {
    button.addEventListener("click", () => act(button.dataset.action, data));
  });
}

// Each change asks first, in the page (outside the sections the refresh redraws): what it does, and for a
// drain its deadline, for a resize the new parallelism.
function ask(action, data) {
  const who = `the executor of scheduler pid ${data.pid}${data.team ? `, team ${data.team}` : ""}`;
  const live = data.control || {};
  const questions = {
    pause: [`Pause ${who}? Running tasks go on; no new task starts until you resume.`, null],
    resume: [`Resume ${who}? Tasks start again.`, null],
    drain: [`Drain ${who}: it takes no new task and is drained once none is left. Deadline in seconds (empty: none):`, ""],
    resize: [`New parallelism for ${who} (configured ${live.configured_parallelism}):`, `${live.parallelism ?? ""}`],
  };
  const [text, value] = questions[action];
  const box = document.getElementById("confirm");
  const input = document.getElementById("confirm-input");
  document.getElementById("confirm-text").textContent = text;
  input.hidden = value === null;
  input.value = value ?? "";
  box.hidden = false;
  return new Promise((resolve) => {
    const done = (answer) => {
      box.hidden = true;
      document.getElementById("confirm-yes").onclick = null;
      document.getElementById("confirm-no").onclick = null;
      resolve(answer);
    };
    document.getElementById("confirm-no").onclick = () => done(null);
    document.getElementById("confirm-yes").onclick = () => {
      const body = { team: data.team || null };
      const answer = input.value.trim();
      if (action === "drain" && answer !== "") {
        const seconds = Number(answer);
        if (!Number.isFinite(seconds) || seconds < 0) {
          document.getElementById("confirm-text").textContent = `A deadline is a number of seconds, at least 0; got "${answer}". ${text}`;
          return;
        }
        body.deadline = seconds;
      }
      if (action === "resize") {
        const limit = Number(answer);
        if (!Number.isInteger(limit) || limit < 1) {
          document.getElementById("confirm-text").textContent = `Parallelism is a whole number of at least 1; got "${answer}". ${text}`;
          return;
        }
        body.parallelism = limit;
      }
      done(body);
    };
  });
}

async function act(action, data) {
  const body = await ask(action, data);
  if (body === null) return;
  const result = document.getElementById("control-result");
  result.hidden = false;
  result.textContent = `${action}: sending`;
  try {
    const response = await fetch(`control/${action}`, {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (response.status === 200) result.textContent = `${action}: applied: ${answer.said}`;
    else if (response.status === 202) result.textContent = `${action}: written, not applied yet by ${answer.pending.join(", ")}: ${answer.said}`;
    else if (response.status === 401 || response.status === 403) result.textContent = `${action}: not allowed (it needs Airflow's permission to edit every DAG)`;
    else {
      const detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail ?? "");
      result.textContent = `${action}: refused (HTTP ${response.status}): ${detail}`;
    }
  } catch (error) {
    result.textContent = `${action}: cannot reach the api-server: ${error.message}`;
  }
  refresh();
}

function showNotice(text) {
  const notice = document.getElementById("notice");
  notice.textContent = text;
  notice.hidden = !text;
}

async function fetchJson(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  return { response, body: response.ok ? await response.json() : null };
}

async function refresh() {
  const now = Date.now() / 1000;
  try {
    const { response, body } = await fetchJson("status");
    if (response.ok) {
      showNotice(body.reason || "");
      setVerdict(body.status, `updated ${new Date().toLocaleTimeString()}`);
      const reasons = body.executors.length === 1 ? [] : body.executors.flatMap((e) => e.reasons);
      fillReasons(document.getElementById("reasons"), reasons);
      const sections = body.executors.map((e) => drawExecutor(e, now));
      document.getElementById("executors").replaceChildren(...sections);
      // Once in the page, where the chart's container has a width.
      sections.forEach((section, i) => {
        const e = body.executors[i];
        chart(section.querySelector(".chart"), e.history, e.written_at || now);
      });
      return;
    }
    if (response.status !== 401 && response.status !== 403) throw new Error(`status: HTTP ${response.status}`);
    // Not logged in (or not allowed): the public verdict still says whether the executor is well.
    const health = await fetchJson("health");
    if (!health.response.ok) throw new Error(`health: HTTP ${health.response.status}`);
    showNotice("Log in to Airflow (with access to its Jobs view) to see slots, tasks and history.");
    setVerdict(health.body.status, `updated ${new Date().toLocaleTimeString()}`);
    fillReasons(
      document.getElementById("reasons"),
      health.body.reason ? [health.body.reason] : health.body.instances.flatMap((i) => i.reasons),
    );
    document.getElementById("executors").replaceChildren();
  } catch (error) {
    setVerdict("unknown", `cannot reach the api-server: ${error.message}`);
  }
}

followColourMode();
refresh();
setInterval(refresh, REFRESH_MS);
