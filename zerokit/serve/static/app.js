// zerokit serve's page: the form's options go to /api/plan as the command line's long options (snake_case); the
// answer is `zerokit plan --json`'s object plus the bars, downloads and text. No framework, no CDN.
"use strict";
const $ = (sel) => document.querySelector(sel);
const form = $("#form");
let seq = 0, timer = null, modelConfig = null, checkConfig = null, checkName = null, tab = "plan";

function gib(bytes) { return (bytes / 2 ** 30).toFixed(2) + " GiB"; }
function secs(s) {
  if (s == null) return "";
  if (s < 120) return s.toPrecision(3) + " s";
  if (s < 7200) return (s / 60).toPrecision(3) + " min";
  if (s < 172800) return (s / 3600).toPrecision(3) + " h";
  return (s / 86400).toPrecision(3) + " days";
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function options() {
  const out = {};
  for (const f of form.elements) {
    if (f.name && f.value.trim() !== "") out[f.name] = f.value.trim();
  }
  return out;
}

function shareUrl(opts) {
  const q = new URLSearchParams(opts);
  if (tab === "check") q.set("tab", "check");
  return location.origin + location.pathname + (q.toString() ? "?" + q.toString() : "");
}

async function post(path, body) {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || ("HTTP " + r.status));
  return data;
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(tab === "plan" ? plan : check, 200);
}

async function plan() {
  const opts = options();
  const url = shareUrl(opts);
  history.replaceState(null, "", url);
  if (!opts.model && !opts.params && !modelConfig) {
    $("#status").textContent = "fill in a model to plan";
    $("#answer").hidden = true;
    return;
  }
  const mine = ++seq;
  $("#status").textContent = "planning...";
  const body = {options: opts};
  if (modelConfig) { body.model_config = modelConfig; delete body.options.model; }
  try {
    const data = await post("/api/plan", body);
    if (mine !== seq) return;  // a newer edit is on its way
    $("#error").hidden = true;
    show(data, url);
    $("#status").textContent = "planned";
    document.body.dataset.state = "answered";
  } catch (e) {
    if (mine !== seq) return;
    $("#error").textContent = e.message;
    $("#error").hidden = false;
    $("#answer").hidden = true;
    $("#status").textContent = "no answer";
    document.body.dataset.state = "error";
  }
}

function show(data, url) {
  const p = data.plan, v = $("#verdict");
  $("#answer").hidden = false;
  const edge = p.verdict === "at the edge";  // fits the memory model, not the published long runs' factor
  v.textContent = edge ? "AT THE EDGE: " + p.choice.label :
    p.fits ? "FITS: " + p.choice.label : (p.choice ? "DOES NOT FIT (least memory: " + p.choice.label + ")" : "NOTHING FITS");
  v.className = edge ? "edge" : p.fits ? "fits" : "nofit";
  v.dataset.fits = String(p.fits);
  v.dataset.verdict = p.verdict;
  const s = $("#summary");
  s.textContent = "";
  if (p.choice) {
    const t = p.time, per = data.setups.length ? data.setups[0].per_gpu_bytes : 0;
    s.dataset.stepSeconds = String(t.step_seconds);
    s.dataset.perGpuBytes = String(per);
    s.dataset.label = p.choice.label;
    let line = gib(per) + " per GPU of " + gib(p.budget.per_gpu_bytes) + "; step " + secs(t.step_seconds);
    if (t.step_seconds_low != null) line += " (likely " + secs(t.step_seconds_low) + " to " + secs(t.step_seconds_high) + ")";
    line += "; " + t.steps + " steps, total " + secs(t.total_seconds);
    if (p.deadline) line += "; deadline: " + p.deadline.gpus + " GPUs";
    s.appendChild(el("span", {}, line));
  }
  for (const n of (p.suggestions || [])) s.appendChild(el("div", {class: "hint"}, "to fit: " + n));
  bars(data.setups, p.budget.per_gpu_bytes);
  const tb = $("#setups tbody");
  tb.textContent = "";
  for (const r of data.setups) {
    const tr = el("tr");
    tr.append(el("td", {}, r.label), el("td", {class: "num"}, gib(r.per_gpu_bytes)), el("td", {class: "num"}, secs(r.step_seconds)), el("td", {}, r.reason));
    tb.appendChild(tr);
  }
  const cmp = $("#compare");
  cmp.hidden = !data.compare;
  if (data.compare) {
    const body = cmp.querySelector("tbody");
    body.textContent = "";
    for (const r of data.compare.compare) {
      const tr = el("tr");
      tr.append(el("td", {}, r.gpu), el("td", {class: "num"}, String(r.gpus)), el("td", {}, r.fits ? "yes" : "no"),
        el("td", {}, r.setup ? (typeof r.setup === "string" ? r.setup : r.setup.label || "") : (r.why_not || "")), el("td", {class: "num"}, secs(r.step_seconds)),
        el("td", {class: "num"}, secs(r.total_seconds)), el("td", {class: "num"}, r.gpu_hours == null ? "" : r.gpu_hours.toFixed(1)));
      body.appendChild(tr);
    }
  }
  const dl = $("#downloads");
  dl.textContent = "";
  for (const [name, content] of Object.entries(data.downloads || {})) {
    if (name === "launch_command") continue;
    const b = el("button", {type: "button", "data-file": name}, "download " + name);
    b.onclick = () => download(name, typeof content === "string" ? content : JSON.stringify(content, null, 2) + "\n");
    dl.appendChild(b);
  }
  $("#launch-command").textContent = (data.downloads || {}).launch_command || "";
  const a = $("#share");
  a.href = url; a.textContent = url;
  $("#text").textContent = data.text;
}

function download(name, text) {
  const a = el("a", {download: name, href: URL.createObjectURL(new Blob([text], {type: "application/octet-stream"}))});
  document.body.appendChild(a); a.click(); a.remove();
}

const PALETTE = ["#0969da", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#953800", "#6e7781", "#e16f24", "#4d2d8f"];
function color(name) { let h = 0; for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0; return PALETTE[h % PALETTE.length]; }

function bars(rows, budget) {
  const box = $("#bars");
  box.textContent = "";
  if (!rows.length) return;
  const W = 640, L = 220, H = 22, max = Math.max(budget, ...rows.map((r) => r.per_gpu_bytes));
  const g = svg("svg", {width: W + L + 20, height: rows.length * (H + 8) + 30, role: "img", "aria-label": "memory per GPU by term"});
  rows.forEach((r, i) => {
    const y = i * (H + 8) + 4;
    const label = svg("text", {x: 0, y: y + 15}); label.textContent = r.label; g.appendChild(label);
    let x = L;
    for (const [term, bytes] of Object.entries(r.terms)) {
      const w = W * bytes / max;
      const rect = svg("rect", {x: x, y: y, width: Math.max(w, 0.5), height: H, fill: color(term)});
      const tip = svg("title"); tip.textContent = term + ": " + gib(bytes); rect.appendChild(tip);
      g.appendChild(rect); x += w;
    }
  });
  const bx = L + W * budget / max;
  g.appendChild(svg("line", {x1: bx, x2: bx, y1: 0, y2: rows.length * (H + 8), stroke: "#cf222e", "stroke-dasharray": "4 3"}));
  const bt = svg("text", {x: Math.min(bx, L + W - 110), y: rows.length * (H + 8) + 16}); bt.textContent = "budget " + gib(budget); g.appendChild(bt);
  box.appendChild(g);
  const legend = el("div", {class: "legend"});
  const seen = new Set(rows.flatMap((r) => Object.keys(r.terms)));
  for (const term of seen) {
    const item = el("span", {}, " " + term);
    item.prepend(el("i", {style: "background:" + color(term)}));
    legend.appendChild(item);
  }
  box.appendChild(legend);
}

async function check() {
  history.replaceState(null, "", shareUrl(options()));
  if (!checkConfig) { $("#check-verdict").textContent = "upload a ds_config.json"; return; }
  const opts = options();
  const keep = ["model", "params", "gpu", "gpus_per_node", "nodes", "seq_len", "finetune", "freeze", "micro_batch", "grad_accum", "precision", "activation_checkpointing"];
  const body = {config: checkConfig, config_name: checkName, options: Object.fromEntries(Object.entries(opts).filter(([k]) => keep.includes(k)))};
  if (modelConfig) { body.model_config = modelConfig; delete body.options.model; }
  const mine = ++seq;
  try {
    const data = await post("/api/check", body);
    if (mine !== seq) return;
    $("#check-error").hidden = true;
    const v = $("#check-verdict");
    v.textContent = !data.valid ? "NOT VALID: " + data.problem : (data.fits ? "VALID, FITS" : "VALID" + (data.check.fits === false ? ", DOES NOT FIT" : ""));
    v.dataset.valid = String(data.valid);
    $("#check-text").textContent = data.text;
    document.body.dataset.state = "checked";
  } catch (e) {
    if (mine !== seq) return;
    $("#check-error").textContent = e.message; $("#check-error").hidden = false;
    document.body.dataset.state = "error";
  }
}

async function readJson(input) {
  const file = input.files[0];
  if (!file) return null;
  const text = await file.text();
  try { return JSON.parse(text); } catch (e) { throw new Error(file.name + " is not JSON: " + e.message); }
}

function setTab(name) {
  tab = name;
  $("#tab-plan").classList.toggle("on", name === "plan");
  $("#tab-check").classList.toggle("on", name === "check");
  $("#plan-view").hidden = name !== "plan";
  $("#check-view").hidden = name !== "check";
  schedule();
}

async function start() {
  // the form's state and its listeners first, so that nothing typed (or uploaded) before the catalog arrives is lost
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q) { const f = form.elements.namedItem(k); if (f) f.value = v; }
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);
  $("#model-file").addEventListener("change", async (e) => {
    try { modelConfig = await readJson(e.target); schedule(); }
    catch (err) { $("#error").textContent = err.message; $("#error").hidden = false; }
  });
  $("#config-file").addEventListener("change", async (e) => {
    try { checkConfig = await readJson(e.target); checkName = e.target.files[0].name; schedule(); }
    catch (err) { $("#check-error").textContent = err.message; $("#check-error").hidden = false; }
  });
  $("#tab-plan").onclick = () => setTab("plan");
  $("#tab-check").onclick = () => setTab("check");
  setTab(q.get("tab") === "check" ? "check" : "plan");
  const cat = await (await fetch("/api/catalog")).json();  // the names the fields suggest
  for (const m of cat.models) $("#models").appendChild(el("option", {value: m}));
  for (const g of cat.gpus) $("#gpus").appendChild(el("option", {value: g}));
}
start();
