// Tabs (arrow keys move between them, as the ARIA tabs pattern has it) and start-up of each view.
import { json, setupKeyForm } from "./api.js";
import { setupChat } from "./chat.js";
import { setupLive } from "./live.js";
import { setupCalc } from "./calc.js";

const tabs = [...document.querySelectorAll('[role="tab"]')];
const shown = new Set();
const starters = {};

function select(tab, focus = true) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute("aria-selected", on ? "true" : "false");
    t.tabIndex = on ? 0 : -1;
    document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
  }
  if (focus) tab.focus();
  const view = tab.getAttribute("aria-controls");
  history.replaceState(null, "", "#" + view.replace("view-", ""));
  if (!shown.has(view) && starters[view]) { shown.add(view); starters[view](); }
  document.dispatchEvent(new CustomEvent("viewchange", { detail: view }));
}

tabs.forEach((tab, i) => {
  tab.addEventListener("click", () => select(tab));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (step) select(tabs[(i + step + tabs.length) % tabs.length]);
    if (event.key === "Home") select(tabs[0]);
    if (event.key === "End") select(tabs[tabs.length - 1]);
  });
});

setupKeyForm();
starters["view-chat"] = setupChat;
starters["view-live"] = setupLive;
starters["view-calc"] = setupCalc;

async function start() {
  try {
    const models = await json("/v1/models");
    const model = models.data[0];
    document.getElementById("model-name").textContent = model.id;
    document.body.dataset.model = model.id;
  } catch (e) {
    document.getElementById("model-name").textContent = "(" + e.message + ")";
  }
  const initial = tabs.find((t) => t.getAttribute("aria-controls") === "view-" + location.hash.slice(1)) || tabs[0];
  select(initial, false);
  document.body.dataset.ready = "1";
}
start();
