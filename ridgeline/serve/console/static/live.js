// Live view: polls /console/api/live (the engine's counters, as /metrics has them) once a second while
// the view is shown, and draws the server's time series.
import { json } from "./api.js";
import { plot } from "./charts.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
let timer = null;
let polling = false;

const ms = (s) => (s === null || s === undefined ? "–" : s < 1 ? (s * 1000).toPrecision(3) + " ms" : s.toPrecision(3) + " s");
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const triple = (p) => (p ? `${ms(p.p50)} / ${ms(p.p90)} / ${ms(p.p99)}` : "–");

function render(d) {
  $("live-running").textContent = d.running;
  $("live-waiting").textContent = d.waiting;
  $("live-tps").textContent = d.tokens.generation_tps.toFixed(1);
  $("live-generated").textContent = d.tokens.generated_total.toFixed(0);
  $("live-window").textContent = d.recent.window;
  $("live-hit").textContent = pct(d.recent.prefix_hit_rate) + (d.recent.n ? ` (${d.recent.n} requests)` : "");
  $("live-ttft").textContent = triple(d.recent.ttft);
  $("live-tpot").textContent = triple(d.recent.tpot);
  const f = d.formats;
  $("live-formats").textContent = `weights ${f.weights} (${f.quantization}); KV ${f.kv}; ${f.dtype}`;
  const missed = d.wall.met ? Object.keys(d.wall.met).filter((k) => d.wall.met[k] === false) : [];
  $("live-wall").textContent = (d.wall.name || "not known yet") +
    (missed.length ? ` (measured ${missed.map((k) => k.toUpperCase()).join(" and ")} over its SLO)` : "");
  $("live-wall").dataset.wall = d.wall.name || "";
  $("live-wall-reason").textContent = d.wall.reason;
  const p = d.wall.predicted, m = d.wall.measured, met = d.wall.met, slo = d.wall.slo;
  const verdict = (k) => `${k.toUpperCase()} ${ms(m[k])} of ${ms(slo[k])}: ` +
    (met[k] === null ? "not measured" : met[k] ? "met" : "missed");
  $("live-wall-check").textContent = !p ? "" :
    `SLOs as measured (median of the last ${d.recent.n}): ${verdict("ttft")}; ${verdict("tpot")}. ` +
    `The advisor's model of this traffic on ${d.wall.hardware} predicts TTFT ${ms(p.ttft)} and TPOT ${ms(p.tpot)}; ` +
    "if they are far apart from the measured, pick the hardware this runs on " +
    "(local: `ridgeline advise --hardware local` measures this machine once).";
  const rows = d.kv.tiers.map((t) => `<tr><th scope="row">${t.name}</th><td>${t.used}</td><td>${t.cached}</td><td>${t.free}</td></tr>`);
  $("live-kv").tBodies[0].innerHTML = rows.join("");
  const s = d.speculative;
  $("live-spec").textContent = !s ? "off" :
    `${s.method}: acceptance ${pct(s.acceptance_rate)}, ${s.tokens_per_step.toFixed(2)} tokens per verification; ` +
    "by draft position: " + s.by_position.map((a, j) => `${j + 1}: ${pct(a)}`).join(", ");
  const t = d.series.map((x) => x.t);
  const pts = (key) => d.series.map((x, i) => [t[i], x[key]]);
  const opts = { xlabel: "seconds (now = 0)", yfloor: 0 };
  plot($("chart-tps"), { ...opts, series: [{ label: "generated", points: pts("generation_tps") },
    { label: "prompt", points: pts("prompt_tps"), dash: [4, 3] }] });
  plot($("chart-reqs"), { ...opts, series: [{ label: "running", points: pts("running") },
    { label: "waiting", points: pts("waiting") }] });
  plot($("chart-kv"), { ...opts, series: [{ label: "used", points: pts("kv_used") },
    { label: "cached", points: pts("kv_cached") }] });
  document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
}

// one polling loop at most: `polling` is set from the first request until the view is hidden
async function poll() {
  timer = null;
  if ($("view-live").hidden) { polling = false; return; }
  polling = true;
  try {
    render(await json("/console/api/live?hardware=" + encodeURIComponent($("live-hardware").value || "local")));
  } catch (e) {
    $("live-wall-reason").textContent = "live view unavailable: " + e.message;
  }
  if ($("view-live").hidden) polling = false;
  else timer = setTimeout(poll, POLL_MS);
}

function now() {  // poll at once (the hardware changed, the view came back), without a second loop
  if (timer) { clearTimeout(timer); poll(); } else if (!polling) poll();
}

export async function setupLive() {
  const select = $("live-hardware");
  try {
    const opts = await json("/console/api/advise");
    select.innerHTML = opts.hardware.map((h) => `<option>${h}</option>`).join("");
  } catch (e) {
    select.innerHTML = "<option>local</option>";
  }
  select.addEventListener("change", now);
  document.addEventListener("viewchange", (ev) => { if (ev.detail === "view-live") now(); });
  now();
}
