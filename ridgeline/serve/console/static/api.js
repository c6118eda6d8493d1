// Requests to this server: the API key (if the server asks for one) as a Bearer header, and errors as
// readable messages from the OpenAI-style error body.
const KEY = "ridgeline.apiKey";
let waiters = [];

export function apiKey() { return sessionStorage.getItem(KEY) || ""; }

export function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

export class ApiError extends Error {
  constructor(status, message, param) { super(message); this.status = status; this.param = param; }
}

export async function errorOf(response) {
  let message = `HTTP ${response.status}`, param = null;
  try {
    const body = await response.json();
    if (body && body.error) { message = body.error.message || message; param = body.error.param || null; }
  } catch (e) { /* not JSON: keep the status */ }
  return new ApiError(response.status, message, param);
}

// fetch with the key; on 401 ask for the key (once for all waiting callers) and try again
export async function call(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headers(options.headers || {}) });
    if (response.status !== 401) return response;
    const err = await errorOf(response);
    await askForKey(apiKey() ? "That key was refused: " + err.message : "");
  }
}

export async function json(path, body) {
  const options = body === undefined ? {} :
    { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await call(path, options);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

function askForKey(message) {
  const form = document.getElementById("key-form");
  document.getElementById("key-error").textContent = message;
  form.hidden = false;
  document.getElementById("api-key").focus();
  return new Promise((resolve) => waiters.push(resolve));
}

export function setupKeyForm() {
  const form = document.getElementById("key-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = document.getElementById("api-key").value.trim();
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    form.hidden = true;
    const ready = waiters;
    waiters = [];
    ready.forEach((resolve) => resolve());
  });
}
