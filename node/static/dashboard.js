// swarm-node local dashboard: polls /api/status (the node's status record plus its round and
// outer-step history) and draws it. Every string that may come from a peer goes through
// textContent, never as HTML markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;

function $(id) { return document.getElementById(id); }
function setText(id, value) { $(id).textContent = value === null || value === undefined ? "-" : String(value); }
function fixed(v, digits) { return typeof v === "number" ? v.toFixed(digits) : "-"; }
function short(s, n) { s = String(s || ""); return s.length <= 2 * n + 1 ? s : s.slice(0, n) + "…" + s.slice(-6); }
function ago(t, now) {
  if (typeof t !== "number") return "-";
  const s = Math.max(0, Math.round(now - t));
  return s < 120 ? s + " s ago" : s < 7200 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago";
}
function bytes(n) {
  n = Number(n || 0);
  for (const u of ["B", "kB", "MB", "GB"]) {
    if (n < 1000 || u === "GB") return u === "B" ? n.toFixed(0) + " B" : n.toFixed(1) + " " + u;
    n /= 1000;
  }
}
function el(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}
function rows(tbodyId, data, empty) {
  const body = $(tbodyId);
  body.replaceChildren();
  if (!data.length) {
    const tr = document.createElement("tr"), td = document.createElement("td");
    td.textContent = empty; td.className = "muted"; tr.append(td); body.append(tr);
    return;
  }
  for (const cells of data) {
    const tr = document.createElement("tr");
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.append(td); }
    body.append(tr);
  }
}

// A line chart of (round, value) points in a 640x220 viewBox, y fixed to [0, max(1, ymax)].
function chart(svgId, points, empty) {
  const svg = $(svgId), W = 640, H = 220, L = 40, R = 12, T = 10, B = 34;
  svg.replaceChildren();
  const pts = points.filter(p => typeof p[1] === "number");
  const ymax = Math.max(1, ...pts.map(p => p[1])), ymin = Math.min(0, ...pts.map(p => p[1]));
  const x0 = pts.length ? pts[0][0] : 0, x1 = pts.length ? pts[pts.length - 1][0] : 1;
  const sx = r => L + (x1 === x0 ? (W - L - R) / 2 : (r - x0) / (x1 - x0) * (W - L - R));
  const sy = v => T + (1 - (v - ymin) / (ymax - ymin)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = ymin + (ymax - ymin) * i / 4, y = sy(v);
    svg.append(el("line", {x1: L, x2: W - R, y1: y, y2: y, class: i ? "grid" : "axis"}));
    svg.append(el("text", {x: L - 6, y: y + 4, "text-anchor": "end", class: "label"}, v.toFixed(2)));
  }
  const ticks = Math.min(6, Math.max(1, x1 - x0)), seen = new Set();
  for (let i = 0; i <= ticks; i++) {
    const r = Math.round(x0 + (x1 - x0) * i / ticks);
    if (seen.has(r)) continue;
    seen.add(r);
    svg.append(el("text", {x: sx(r), y: H - 12, "text-anchor": "middle", class: "label"}, String(r)));
  }
  svg.append(el("text", {x: W - R, y: H - 1, "text-anchor": "end", class: "label"}, "round"));
  if (!pts.length) {
    svg.append(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "label"}, empty || "no rounds yet"));
    svg.dataset.points = "0";
    return;
  }
  svg.append(el("polyline", {class: "line", points: pts.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ")}));
  for (const [r, v] of pts) {
    const c = el("circle", {cx: sx(r).toFixed(1), cy: sy(v).toFixed(1), r: pts.length > 80 ? 1.5 : 3,
                            "data-round": r, "data-value": v});
    c.append(el("title", {}, "round " + r + ": " + v.toFixed(3)));
    svg.append(c);
  }
  svg.dataset.points = String(pts.length);
}

function render(data) {
  const s = data.status, now = s.time;
  setText("peer-id", short(s.peer_id, 12));
  setText("model", short(s.model, 12));
  setText("updated", "updated " + new Date(now * 1000).toLocaleTimeString());
  setText("round", s.round);
  setText("rounds-per-s", fixed(s.rounds_per_s, 2));
  setText("rounds-done", s.rounds_done);
  const p = s.round_phase;
  let phase = s.phase, detail = "", frac = 0;
  if (s.phase === "training" && p) {
    phase = p.name === "outer" ? "outer step" + (p.stage ? " · " + p.stage : "") : p.name;
    detail = (p.total ? p.done + " / " + p.total + (p.name === "generate" ? " tokens" : p.name === "train" ? " passes" : "") + " · " : "")
      + Math.max(0, Math.round(now - p.since)) + " s in this phase";
    frac = p.total ? Math.min(1, p.done / p.total) : 0;
  }
  setText("phase", phase);
  setText("phase-detail", detail);
  $("phase-bar").style.width = (100 * frac).toFixed(0) + "%";
  setText("reward", fixed(s.mean_reward, 3));
  setText("accuracy", fixed(s.accuracy, 2));
  const h = s.heldout;
  setText("heldout", h ? fixed(h.greedy_accuracy, 2) : null);
  setText("heldout-sampled", h ? fixed(h.sampled_accuracy, 2) : null);
  setText("heldout-after", h ? "after " + h.after_rounds + " rounds, " + h.questions + " questions" : "no score yet");
  setText("peers", s.peers);
  setText("reachability", s.reachability || "unknown");
  // connected peers by link (swarm.holepunch): relayed = every connection through a circuit relay
  const l = s.links;
  setText("links", l ? l.direct + " direct · " + l.relayed + " relayed" : "links not reported yet");
  const f = s.feeds;  // feeds mode: sources by kind (swarm.feed_standing), what idle ones took
  setText("feeds", f ? f.proven + " proven · " + f.live + " live · " + f.trial + " on trial" : "-");
  setText("feeds-detail", f ? f.idle + " idle now · dropped " + f.dropped_idle + " idle, "
    + f.dropped_no_signal + " without signal · " + f.idle_slot_rounds + " slot-rounds held by idle sources · "
    + (f.searched || 0) + " tried in searches · " + (f.network_full || 0) + " refused for a full network"
    : "not in feeds mode");
  $("feeds").className = f && (2 * f.idle > f.proven + f.live + f.trial
    || (!(f.proven + f.live) && f.dropped_idle)) ? "bad" : "";
  const kids = Object.entries(s.children || {});
  const healthy = !["failed", "stopped"].includes(s.phase) && kids.every(([, c]) => c.alive);
  setText("health", healthy ? "healthy" : "unhealthy");
  $("health").className = healthy ? "ok" : "bad";
  const ck = s.last_checkpoint;
  setText("health-detail", kids.map(([n, c]) => n + (c.alive ? " up" : " DOWN") + (c.restarts ? " (" + c.restarts + " restarts)" : "")).join(", ")
    + " · checkpoint " + (ck ? "after round " + (ck.round - 1) + ", " + ago(ck.time, now) : "none yet this run"));
  setText("rollouts-out", s.rollouts_published_total);
  setText("rollouts-in", s.rollouts_received_total);
  setText("rollouts-used", s.external_used_total);
  setText("rejected", s.rejected_total);
  const c = s.compute;  // engine.staleness: generation and training overlapped, or in turn
  const pct = x => (typeof x === "number" ? Math.round(100 * x) + " %" : null);
  setText("generator-busy", c ? pct(c.generator_busy) : null);
  setText("trainer-busy", c ? pct(c.trainer_busy) : null);
  setText("staleness", c && c.staleness !== null ? String(c.staleness) : null);
  setText("dropped-stale", c ? c.dropped_stale_total : 0);
  const reasons = d => Object.entries(d || {}).filter(([, n]) => n).sort().map(([k, n]) => [k, String(n)]);
  rows("rejected-reasons", reasons(s.rejected_by_reason), "none");
  rows("gossip-reasons", reasons(s.gossip_rejected), "none");
  rows("peer-rows", (s.peers_seen || []).map(q => [short(q.peer_id, 10), q.model === s.model ? "same as ours" : q.model ? short(q.model, 8) : "none (bootstrap)", q.link || "not connected", ago(q.last_seen, now)]),
       "no peers seen yet");
  // peers held off by reason, totals (collectives/leader.py): an attack on the outer step shows here
  const heldOff = b => Object.entries(b || {}).filter(([, n]) => Number(n) > 0).sort()
    .map(([k, n]) => k + " " + Number(n)).join(", ") || "none";
  rows("outer-rows", data.outer_steps.slice(-20).reverse().map(o => [String(o.step), String(o.status), String(o.peers),
       bytes(o.bytes_sent), bytes(o.bytes_received), fixed(o.seconds, 1), short(o.param_hash, 6),
       heldOff(o.blames_total)]), "no outer steps yet");
  chart("reward-chart", data.rounds.map(r => [r.round, r.mean_reward]));
  chart("accuracy-chart", data.rounds.map(r => [r.round, r.accuracy]));
  chart("heldout-chart", data.rounds.filter(r => r.heldout).map(r => [r.heldout.after_rounds, r.heldout.greedy_accuracy]),
        "no held-out score yet (every eval_every rounds)");
  document.body.dataset.ready = data.rounds.length ? "1" : "0";
  document.body.dataset.round = String(s.round);
}

async function refresh() {
  try {
    const res = await fetch("/api/status", {cache: "no-store"});
    const data = await res.json();
    if (data.status) render(data);
  } catch (e) {
    setText("updated", "node not reachable (" + e + ")");
  }
  setTimeout(refresh, REFRESH_MS);
}
refresh();
