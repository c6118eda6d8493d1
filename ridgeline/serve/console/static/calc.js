// Calculators: the form sends the CLI's options to /console/api/advise/NAME, which runs the advisor's own
// functions; the page shows each value's CLI line (formula with the numbers substituted in) and draws
// what the server computed. No advisor arithmetic here.
import { json } from "./api.js";
import { plot } from "./charts.js";

const $ = (id) => document.getElementById(id);
const COMMON = ["model", "hardware", "gpus", "weights", "kv", "prompt_len", "output_len", "concurrency", "prefix_share"];
const FIELDS = {
  kv: COMMON, gpus: COMMON, quant: COMMON, roofline: COMMON,
  spec: [...COMMON, "alpha", "draft_len", "draft_cost"],
  disagg: [...COMMON, "rate", "ttft_slo_ms", "tpot_slo_ms", "chunk"],
};
const LABELS = {
  model: "model", hardware: "hardware", gpus: "devices (empty: the fewest that fit)", weights: "weight precision",
  kv: "KV cache precision", prompt_len: "prompt tokens", output_len: "output tokens", concurrency: "concurrent requests",
  prefix_share: "shared prefix fraction f", alpha: "acceptance rate alpha", draft_len: "draft tokens k",
  draft_cost: "draft cost c (x target step)", rate: "requests/s (empty: use concurrency)", ttft_slo_ms: "TTFT SLO (ms)",
  tpot_slo_ms: "TPOT SLO (ms)", chunk: "prefill chunk (tokens)",
};
const TITLES = { kv: "KV cache sizing", gpus: "Devices and parallelism", spec: "Speculative decoding break-even",
  quant: "Quantization estimator", disagg: "Disaggregation check", roofline: "Roofline" };
let options = null;
let seq = 0;  // only the latest answer is shown (a slider sends many)

const kind = () => document.querySelector('input[name="calc"]:checked').value;

function buildFields() {
  const box = $("calc-fields");
  const keep = {};
  box.querySelectorAll("input, select").forEach((el) => { keep[el.name] = el.value; });
  box.innerHTML = "";
  for (const name of FIELDS[kind()]) {
    const wrap = document.createElement("div");
    const label = document.createElement("label");
    label.htmlFor = "calc-" + name;
    label.textContent = LABELS[name];
    const choices = { model: options.models, hardware: options.hardware, weights: options.weights || options.precisions, kv: options.precisions }[name];
    const el = document.createElement(choices ? "select" : "input");
    if (choices) el.innerHTML = choices.map((c) => `<option>${c}</option>`).join("");
    else { el.type = "text"; el.inputMode = "decimal"; }
    el.id = "calc-" + name;
    el.name = name;
    const d = options.defaults[name];
    el.value = name in keep ? keep[name] : d === null ? "" : String(d);
    wrap.append(label, el);
    box.append(wrap);
  }
  $("spec-slider").hidden = kind() !== "spec";
  $("roof-live-label").hidden = kind() !== "roofline";
  liveFields();
  $("calc-title").textContent = TITLES[kind()];
}

function liveFields() {
  const live = kind() === "roofline" && $("roof-live").checked;
  $("calc-fields").querySelectorAll("input, select").forEach((el) => { el.disabled = live && el.name !== "hardware"; });
}

function body() {
  const b = {};
  $("calc-fields").querySelectorAll("input, select").forEach((el) => { b[el.name] = el.value; });
  if (kind() === "spec") b.batch = 2 ** Number($("calc-batch").value);
  if (kind() === "roofline" && $("roof-live").checked) return { live: true, hardware: b.hardware };
  return b;
}

function showError(e) {
  $("calc-error").textContent = e.message;
  $("calc-values").innerHTML = "";
  $("calc-text").textContent = "";
  $("calc-techniques").hidden = true;
  $("calc-chart-box").hidden = true;
  const bad = e.param && $("calc-" + e.param);
  if (bad) bad.setAttribute("aria-invalid", "true");
}

function sections(view) {
  const out = $("calc-values");
  out.innerHTML = "";
  for (const sec of view) {
    const s = document.createElement("section");
    s.dataset.section = sec.key;
    const h = document.createElement("h3");
    h.textContent = sec.title;
    s.append(h);
    for (const st of sec.steps) {
      const div = document.createElement("div");
      div.className = "step";
      div.dataset.key = `${sec.key}.${st.key}`;
      div.dataset.value = st.value === null ? "" : String(st.value);
      const [head, formula] = st.text.split(/\s{3}\[/);
      div.textContent = head;
      const f = document.createElement("span");
      f.className = "f";
      f.textContent = formula ? "[" + formula : "";
      div.append(f);
      s.append(div);
    }
    if (sec.notes.length) {
      const ul = document.createElement("ul");
      ul.className = "notes";
      for (const n of sec.notes) { const li = document.createElement("li"); li.textContent = n; ul.append(li); }
      s.append(ul);
    }
    out.append(s);
  }
}

function specChart(r) {
  $("calc-chart-box").hidden = false;  // shown first: a hidden canvas has no width to draw at
  const pts = (key) => r.curve.map((c) => [c.batch, c[key]]);
  plot($("calc-chart"), { xlog: true, xlabel: "batch size", ylabel: "speed-up", yfloor: 0,
    hlines: [{ y: 1, label: "break-even" }],
    series: [{ label: `gain at k`, points: pts("gain") }, { label: "best k", points: pts("best_gain"), dash: [4, 3] },
      { label: "", points: [[r.at_batch.batch, r.at_batch.gain]], marker: 6, color: "#c4432b" }] });
  $("calc-chart-note").textContent = r.at_batch_text;
}

function roofChart(r) {
  $("calc-chart-box").hidden = false;
  const roof = r.roofline;
  const work = roof.points.filter((p) => p.workload), other = roof.points.filter((p) => !p.workload);
  plot($("calc-chart"), { xlog: true, ylog: true, xlabel: "FLOP per byte", ylabel: "FLOP/s",
    vlines: [{ x: roof.ridge_ai, label: "ridge" }],
    series: [{ label: "roof", points: roof.roof, color: "#1b1f24" },
      { label: "this workload", points: work.map((p) => [p.ai, p.achieved]), marker: 6, color: "#c4432b", labels: work.map((p) => p.name) },
      { label: "other batch sizes", points: other.map((p) => [p.ai, p.achieved]), marker: 3, labels: other.map((p) => p.name) }] });
  const w = r.workload;
  $("calc-chart-note").textContent = `${roof.title}. Workload: prompt ${w.prompt_len}, output ${w.output_len}, ` +
    `${w.concurrency} concurrent, prefix share ${w.prefix_share.toFixed(2)}` + ($("roof-live").checked ? " (this server's recent requests)" : "");
  $("calc-values").innerHTML = "";
  const ul = document.createElement("ul");
  ul.className = "notes";
  for (const p of roof.points) {
    const li = document.createElement("li");
    li.dataset.point = p.name;
    li.textContent = `${p.name}: ${p.bound}-bound`;
    ul.append(li);
  }
  $("calc-values").append(ul);
}

async function run() {
  $("calc-error").textContent = "";
  document.querySelectorAll('#calc-form [aria-invalid="true"]').forEach((el) => el.removeAttribute("aria-invalid"));
  const name = kind();
  const form = $("calc-form");
  const mine = ++seq;
  form.dataset.state = "busy";
  try {
    const r = await json("/console/api/advise/" + name, body());
    if (mine !== seq) return;
    $("calc-cli").hidden = name === "roofline";
    $("calc-techniques").hidden = !r.techniques_text;
    $("calc-techniques").textContent = r.techniques_text || "";
    if (name === "roofline") roofChart(r);
    else {
      sections(r.view);
      $("calc-text").textContent = r.text;
      if (name === "spec") specChart(r); else $("calc-chart-box").hidden = true;
    }
    form.dataset.state = "done";
  } catch (e) {
    if (mine !== seq) return;
    showError(e);
    form.dataset.state = "error";
  }
}

export async function setupCalc() {
  try {
    options = await json("/console/api/advise");
  } catch (e) {
    showError(e);
    return;
  }
  buildFields();
  document.querySelectorAll('input[name="calc"]').forEach((r) => r.addEventListener("change", () => { buildFields(); run(); }));
  $("calc-form").addEventListener("submit", (ev) => { ev.preventDefault(); run(); });
  $("calc-batch").addEventListener("input", () => {
    $("calc-batch-out").textContent = String(2 ** Number($("calc-batch").value));
    run();
  });
  $("roof-live").addEventListener("change", () => { liveFields(); run(); });
  run();
}
