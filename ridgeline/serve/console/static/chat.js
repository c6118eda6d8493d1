// Chat playground: streams /v1/chat/completions with fetch + ReadableStream (EventSource cannot send the
// API key), shows TTFT, decode tokens/s and cached prompt tokens per reply; Stop aborts the fetch, and
// the server aborts the request when its connection closes.
import { call, errorOf } from "./api.js";

const $ = (id) => document.getElementById(id);
const turns = [];  // the conversation sent with each request
let controller = null;

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("chat-log").append(div);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return div;
}

function number(id, parse) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : parse(raw);
}

function body(messages) {
  const b = { model: document.body.dataset.model, messages, stream: true,
    stream_options: { include_usage: true } };
  const fields = { temperature: ["chat-temperature", parseFloat], top_p: ["chat-top-p", parseFloat],
    max_tokens: ["chat-max-tokens", (x) => parseInt(x, 10)], seed: ["chat-seed", (x) => parseInt(x, 10)] };
  for (const [name, [id, parse]] of Object.entries(fields)) {
    const v = number(id, parse);
    if (v !== undefined) b[name] = v;
  }
  const schema = schemaOf();
  if (schema !== undefined) {
    b.response_format = { type: "json_schema", json_schema: { name: "console", schema, strict: true } };
  }
  const tools = jsonBox("chat-tools", "Tools", (v) => Array.isArray(v), "must be a JSON list of tools");
  if (tools !== undefined) b.tools = tools;
  return b;
}

// an optional JSON box: undefined when empty; an Error naming the box when it does not parse or check
function jsonBox(id, name, check, what) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  let value;
  try {
    value = JSON.parse(raw);
  } catch (e) {
    throw new Error(name + ": not valid JSON (" + e.message + ")");
  }
  if (!check(value)) throw new Error(name + ": " + what);
  return value;
}

function schemaOf() {
  return jsonBox("chat-schema", "JSON schema", (v) => v !== null && typeof v === "object" && !Array.isArray(v),
    "must be a JSON object");
}

// yields each JSON payload of the SSE stream until [DONE]
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function meta(stats) {
  const parts = [];
  if (stats.tokens !== null) parts.push(`${stats.tokens} tokens`);
  if (stats.ttft !== null) parts.push(`TTFT ${(stats.ttft * 1000).toFixed(0)} ms`);
  if (stats.tps !== null) parts.push(`${stats.tps.toFixed(1)} tok/s`);
  if (stats.cached !== null) parts.push(`${stats.cached} cached prompt tokens`);
  if (stats.finish) parts.push(stats.finish);
  return parts.join(" · ");
}

async function send(text) {
  const system = $("chat-system").value.trim();
  turns.push({ role: "user", content: text });
  bubble("user", text);
  const reply = bubble("assistant", "");
  const content = document.createElement("span");
  content.className = "content";
  const info = document.createElement("span");
  info.className = "meta";
  info.dataset.state = "waiting";
  // a reasoning model's thinking (delta.reasoning_content), folded above the answer; tool calls below it
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  thinking.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const thought = document.createElement("span");
  thinking.append(summary, thought);
  const calls = document.createElement("div");
  calls.className = "tool-calls";
  const callText = [];  // index -> "name(arguments)"
  reply.append(thinking, content, calls, info);
  const messages = (system ? [{ role: "system", content: system }] : []).concat(turns);
  const stats = { tokens: null, ttft: null, tps: null, cached: null, finish: null };
  controller = new AbortController();
  setBusy(true);
  const t0 = performance.now();
  let first = null;
  try {
    const payload = JSON.stringify(body(messages));  // a bad schema throws here: shown, nothing sent
    const response = await call("/v1/chat/completions", { method: "POST", signal: controller.signal,
      headers: { "Content-Type": "application/json" }, body: payload });
    if (!response.ok) throw await errorOf(response);
    info.dataset.state = "streaming";
    for await (const ev of events(response)) {
      if (ev.error) throw new Error(ev.error.message);
      const choice = ev.choices && ev.choices[0];
      const delta = (choice && choice.delta) || {};
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        if (first === null) { first = performance.now(); stats.ttft = (first - t0) / 1000; }
      }
      if (delta.reasoning_content) {
        thinking.hidden = false;
        thought.textContent += delta.reasoning_content;
      }
      if (delta.content) content.textContent += delta.content;
      for (const call of delta.tool_calls || []) {
        const f = call.function || {};
        const prev = callText[call.index] || { name: "", args: "" };
        callText[call.index] = { name: prev.name + (f.name || ""), args: prev.args + (f.arguments || "") };
        calls.textContent = callText.map((c) => `call ${c.name}(${c.args})`).join("\n");
      }
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
      if (choice && choice.finish_reason) stats.finish = choice.finish_reason;
      if (ev.usage) {
        stats.tokens = ev.usage.completion_tokens;
        const details = ev.usage.prompt_tokens_details;
        stats.cached = details && details.cached_tokens !== undefined ? details.cached_tokens : null;
      }
      info.textContent = meta(stats);
    }
    const seconds = first === null ? 0 : (performance.now() - first) / 1000;
    if (stats.tokens > 1 && seconds > 0) stats.tps = (stats.tokens - 1) / seconds;
    turns.push({ role: "assistant", content: content.textContent });  // calls are shown, not replayed
    info.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      stats.finish = "stopped";
      info.dataset.state = "stopped";
      turns.push({ role: "assistant", content: content.textContent });
    } else {
      reply.classList.add("error");
      info.dataset.state = "error";
      stats.finish = "error: " + e.message;
      turns.pop();
    }
  } finally {
    info.textContent = meta(stats);
    controller = null;
    setBusy(false);
  }
}

function setBusy(busy) {
  $("chat-send").disabled = busy;
  $("chat-stop").disabled = !busy;
}

export function setupChat() {
  $("chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("chat-text").value.trim();
    if (!text || controller) return;
    $("chat-text").value = "";
    send(text);
  });
  $("chat-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("chat-form").requestSubmit(); }
  });
  $("chat-stop").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => { turns.length = 0; $("chat-log").textContent = ""; });
}
