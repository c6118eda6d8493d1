// Small charts on a canvas: lines and points on linear or log axes, with a legend. Only drawing here;
// every number plotted comes from the server.
const COLORS = ["#0b5cad", "#c4432b", "#1a7f37", "#8250df", "#9a6700", "#57606a"];

function ticks(lo, hi, log) {
  if (log) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) out.push(10 ** e);
    return out.filter((t) => t >= lo * 0.999 && t <= hi * 1.001);
  }
  const span = hi - lo || 1;
  const step = 10 ** Math.floor(Math.log10(span / 4));
  const unit = [1, 2, 5, 10].map((m) => m * step).find((s) => span / s <= 5) || step * 10;
  const out = [];
  for (let t = Math.ceil(lo / unit) * unit; t <= hi + 1e-9; t += unit) out.push(t);
  return out;
}

export function short(v) {
  const a = Math.abs(v);
  if (a === 0) return "0";
  const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [s, u] of units) if (a >= s) return +(v / s).toPrecision(3) + u;
  if (a < 0.01) return v.toExponential(0);
  return String(+v.toPrecision(3));
}

function range(values, log, floor) {
  let vals = values.filter((v) => Number.isFinite(v) && (!log || v > 0));
  if (!vals.length) vals = [log ? 1 : 0, 1];
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (floor !== undefined) lo = Math.min(lo, floor);
  if (log) { lo /= 1.5; hi *= 1.5; } else { if (hi === lo) hi = lo + 1; hi += (hi - lo) * 0.08; }
  return [lo, hi];
}

// spec: {series: [{label, points: [[x, y]], color, dash, marker, labels}], xlog, ylog, xlabel, ylabel,
//        yfloor, vlines: [{x, label}], hlines: [{y, label}]}
export function plot(canvas, spec) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300, height = canvas.height / (canvas.dataset.dpr || 1);
  canvas.dataset.dpr = dpr;
  canvas.width = width * dpr;
  canvas.height = height * dpr;
  canvas.style.height = height + "px";
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  const all = spec.series.flatMap((s) => s.points);
  const [x0, x1] = range(all.map((p) => p[0]).concat((spec.vlines || []).map((v) => v.x)), spec.xlog);
  const [y0, y1] = range(all.map((p) => p[1]).concat((spec.hlines || []).map((v) => v.y)), spec.ylog, spec.yfloor);
  const L = 48, R = 10, T = 24, B = spec.xlabel ? 34 : 20;  // the top band holds the y label and legend
  const fx = (x) => L + (spec.xlog ? Math.log(x / x0) / Math.log(x1 / x0) : (x - x0) / (x1 - x0)) * (width - L - R);
  const fy = (y) => height - B - (spec.ylog ? Math.log(y / y0) / Math.log(y1 / y0) : (y - y0) / (y1 - y0)) * (height - T - B);
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#d0d7de";
  g.fillStyle = "#57606a";
  g.lineWidth = 1;
  for (const t of ticks(y0, y1, spec.ylog)) {
    g.beginPath(); g.moveTo(L, fy(t)); g.lineTo(width - R, fy(t)); g.stroke();
    g.fillText(short(t), 2, fy(t) + 4);
  }
  for (const t of ticks(x0, x1, spec.xlog)) {
    g.beginPath(); g.moveTo(fx(t), T); g.lineTo(fx(t), height - B); g.stroke();
    g.fillText(short(t), fx(t) - 8, height - B + 13);
  }
  if (spec.xlabel) g.fillText(spec.xlabel, L, height - 4);
  let legendX = 2;
  if (spec.ylabel) { g.fillText(spec.ylabel, 2, 12); legendX += g.measureText(spec.ylabel).width + 16; }
  for (const v of spec.vlines || []) line(g, [[fx(v.x), T], [fx(v.x), height - B]], "#57606a", [4, 3], v.label);
  for (const h of spec.hlines || []) line(g, [[L, fy(h.y)], [width - R, fy(h.y)]], "#57606a", [4, 3], h.label);
  const placed = [];  // label positions drawn so far: a label too close to one is left out
  spec.series.forEach((s, i) => {
    const color = s.color || COLORS[i % COLORS.length];
    const pts = s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])).map((p) => [fx(p[0]), fy(p[1])]);
    if (s.marker) pts.forEach(([x, y], j) => {
      g.fillStyle = color;
      g.beginPath(); g.arc(x, y, s.marker, 0, 2 * Math.PI); g.fill();
      if (!s.labels || !s.labels[j]) return;
      const box = [x + 6, y - 17, g.measureText(s.labels[j]).width, 13];  // left, top, width, height
      const hit = (b) => box[0] < b[0] + b[2] && b[0] < box[0] + box[2] && box[1] < b[1] + b[3] && b[1] < box[1] + box[3];
      if (placed.some(hit)) return;
      placed.push(box);
      g.fillStyle = "#1b1f24";
      g.fillText(s.labels[j], x + 6, y - 6);
    });
    else line(g, pts, color, s.dash || []);
    if (s.label) {
      g.fillStyle = color;
      g.fillRect(legendX, 7, 10, 3);
      g.fillStyle = "#1b1f24";
      g.fillText(s.label, legendX + 14, 12);
      legendX += g.measureText(s.label).width + 30;
    }
  });
}

function line(g, pts, color, dash, label) {
  if (pts.length < 2) return;
  g.save();
  g.strokeStyle = color;
  g.lineWidth = 2;
  g.setLineDash(dash);
  g.beginPath();
  pts.forEach(([x, y], i) => (i ? g.lineTo(x, y) : g.moveTo(x, y)));
  g.stroke();
  if (label) { g.fillStyle = color; g.fillText(label, pts[0][0] + 4, pts[0][1] + 12); }
  g.restore();
}
