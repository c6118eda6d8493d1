"""Screenshots of the web console for docs/console/: each view on a laptop screen, and the main ones at a
phone's width. Serves a real model (default: the default model) on a free port, sends it some traffic so
the live view has numbers, and drives the system's chromium with Playwright.

python3 scripts/console_screenshots.py [--model smollm2-135m] [--out docs/console] [--hardware NAME]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ridgeline.config import EngineConfig  # noqa: E402
from ridgeline.engine.llm_engine import LLMEngine  # noqa: E402
from ridgeline.serve.app import build_app  # noqa: E402
from ridgeline.serve.server import ServerThread  # noqa: E402
from ridgeline.serve.state import ServerSettings  # noqa: E402

DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "What is a roofline model?",
             "Why is the sky blue?"]


def traffic(url: str, name: str, stop: threading.Event, max_tokens: int = 48) -> None:
    """Chat requests that share a system prompt (prefix-cache hits) until `stop` is set."""
    i = 0
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            c.post(url + "/v1/chat/completions", json={
                "model": name, "max_tokens": max_tokens, "temperature": 0.7, "seed": i,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i % 4]}]})
            i += 1


def calc(page, kind: str, values: dict, batch_steps: int = 0) -> None:
    page.check(f"input[name='calc'][value='{kind}']")
    page.wait_for_selector("#calc-form[data-state='done'], #calc-form[data-state='error']")
    for name, value in values.items():
        sel = f"#calc-{name}"
        if page.eval_on_selector(sel, "e => e.tagName") == "SELECT":
            page.select_option(sel, value)
        else:
            page.fill(sel, value)
    if kind == "roofline":
        page.check("#roof-live")
    page.click("#calc-run")
    page.wait_for_selector("#calc-form[data-state='done']")
    if batch_steps:
        page.focus("#calc-batch")
        for _ in range(batch_steps):
            page.keyboard.press("ArrowRight")
        page.wait_for_function(f"() => document.getElementById('calc-chart-note').textContent.startsWith("
                               f"'batch {2 ** batch_steps}:')")


def shoot(browser, url: str, out: Path, hardware: str, phone: bool) -> None:
    size, tag = (PHONE, "phone") if phone else (DESKTOP, "desktop")
    page = browser.new_page(viewport=size, device_scale_factor=2 if phone else 1)
    page.set_default_timeout(300_000)
    page.goto(url + "/#chat")
    page.wait_for_selector("body[data-ready='1']")
    page.fill("#chat-system", SYSTEM)
    page.fill("#chat-max-tokens", "64")
    page.fill("#chat-temperature", "0")
    for q in QUESTIONS[:2]:
        page.fill("#chat-text", q)
        page.press("#chat-text", "Enter")
        page.wait_for_function(f"() => document.querySelectorAll(\".meta[data-state='done']\").length === "
                               f"{QUESTIONS.index(q) + 1}")
    page.evaluate("document.activeElement.blur(); window.scrollTo(0, 0)")
    page.screenshot(path=out / f"chat-{tag}.png")
    page.click("#tab-live")
    page.select_option("#live-hardware", hardware)
    page.wait_for_function("() => Number(document.body.dataset.liveUpdates || 0) >= 8")
    page.screenshot(path=out / f"live-{tag}.png", full_page=True)
    page.click("#tab-calc")
    page.wait_for_selector("#calc-form[data-state]")
    shots = [("spec", {"model": "Llama-3.1-8B", "hardware": "H100-SXM", "prompt_len": "256", "output_len": "128"}, 6)]
    if not phone:
        big = {"model": "Llama-3.1-70B", "hardware": "H100-SXM", "prompt_len": "2000", "output_len": "500",
               "concurrency": "64"}
        shots = [("kv", big, 0), ("gpus", big, 0), *shots, ("quant", {"model": "Llama-3.1-8B", "hardware": "L4",
                 "prompt_len": "1024", "output_len": "256", "concurrency": "1"}, 0),
                 ("disagg", {**big, "rate": "4"}, 0), ("roofline", {"hardware": hardware}, 0)]
    for kind, values, steps in shots:
        calc(page, kind, values, steps)
        page.screenshot(path=out / f"calc-{kind}-{tag}.png", full_page=True)
    page.close()


def main() -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default="docs/console")
    ap.add_argument("--hardware", default=None, help="for the live wall (default: local if profiled, else Xeon-8480)")
    args = ap.parse_args()
    from ridgeline.advisor.local_profile import cached_profile
    hardware = args.hardware or ("local" if cached_profile() else "Xeon-8480")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = LLMEngine(EngineConfig.from_kwargs(args.model, progress=False, kv_cache_memory="256MiB"))
    stop = threading.Event()
    with ServerThread(build_app(engine, ServerSettings("smollm2", quiet=True))) as s, sync_playwright() as pw:
        load = threading.Thread(target=traffic, args=(s.url, "smollm2", stop), daemon=True)
        load.start()
        time.sleep(2)
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        for phone in (False, True):
            shoot(browser, s.url, out, hardware, phone)
        browser.close()
        stop.set()
        load.join()
    print("\n".join(sorted(str(p) for p in out.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
