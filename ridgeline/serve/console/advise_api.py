"""POST /console/api/advise/{kv,gpus,spec,disagg,quant,roofline}: the advisor's calculators through the
same code as `ridgeline advise NAME --json` (scenario_from_args, CALCULATORS, as_json, render). The body
holds the CLI's options by their argument names (prompt_len for --prompt-len); what it leaves out takes
the CLI's default. The answer: `json` (what --json prints), `text` (what the CLI prints) and, for the
charts, data from the advisor's own functions. Bad input is a 400 with the advisor's message."""
from __future__ import annotations

import argparse
import functools
import math

from fastapi import APIRouter, Request

from ridgeline.advisor.calculators import CALCULATORS, spec_curve
from ridgeline.advisor.cli import scenario_from_args
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import HARDWARE
from ridgeline.advisor.model_table import TABLE, lookup
from ridgeline.advisor.plot import roofline_points
from ridgeline.advisor.report import as_json, render
from ridgeline.advisor.units import BYTES, finite_or_none, fmt_ratio, fmt_time
from ridgeline.serve.console.live_wall import NO_PROFILE, live_scenario, precisions, served_spec
from ridgeline.serve.state import state_of

router = APIRouter()
SERVED = "served"  # the model this server runs
FIELDS = {"model": str, "hardware": str, "gpus": int, "weights": str, "kv": str, "prompt_len": int,
          "output_len": int, "concurrency": int, "rate": float, "prefix_share": float, "ttft_slo_ms": float,
          "tpot_slo_ms": float, "alpha": float, "draft_len": int, "draft_cost": float, "chunk": int}
OPTIONAL = {"gpus", "rate"}  # None (empty) means: the CLI's "not given"
SPEC_CHART = tuple(1 << i for i in range(13))  # batch sizes 1..4096 for the speculative chart
MAX_BATCH = 1 << 14


@functools.cache
def cli_defaults() -> dict:
    from ridgeline.cli import build_parser
    ns = build_parser().parse_args(["advise"])
    return {k: getattr(ns, k) for k in FIELDS}


def _value(name: str, raw):
    """One field as the CLI would take it: numbers or numeric strings; empty only where the CLI has none."""
    kind, what = FIELDS[name], name.replace("_", " ")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if name in OPTIONAL:
            return None
        raise AdvisorError(f"{what} is empty", name)
    if kind is str:
        if not isinstance(raw, str):
            raise AdvisorError(f"{what} must be a name, got {raw!r}", name)
        return raw.strip()
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise AdvisorError(f"{what} must be a number, got {raw!r}", name)
    try:
        x = float(raw)
    except ValueError:
        raise AdvisorError(f"{what} must be a number, got {raw!r}", name) from None
    if not math.isfinite(x):
        raise AdvisorError(f"{what} must be a finite number, got {raw!r}", name)
    if kind is int:
        if not x.is_integer():
            raise AdvisorError(f"{what} must be a whole number, got {raw!r}", name)
        if abs(x) > 1 << 40:
            raise AdvisorError(f"{what} is out of range: {raw!r}", name)
        return int(x)
    return x


def parse(body: dict) -> argparse.Namespace:
    if not isinstance(body, dict):
        raise AdvisorError("the body must be a JSON object of the advisor's options")
    unknown = sorted(set(body) - set(FIELDS) - {"batch", "live"})
    if unknown:
        raise AdvisorError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}", unknown[0])
    values = {**cli_defaults(), "model": SERVED}
    values.update({k: _value(k, v) for k, v in body.items() if k in FIELDS})
    return argparse.Namespace(**values, reprofile=False, json=True, plot=None)


def scenario(request: Request, args: argparse.Namespace):
    from ridgeline.advisor.defaults import hardware_name
    state = state_of(request)
    args.hardware = hardware_name(args.hardware)  # auto: the GPU's table entry, else this machine
    if args.model == SERVED:
        spec = served_spec(state.engine, state.settings.served_model_name)
        if args.weights.lower() == "auto":  # the format this engine runs
            args.weights = precisions(state.engine.info, spec)[0]
        return scenario_from_args(args, spec, local=_cached_hardware)
    if lookup(args.model) is None:
        raise AdvisorError(f"unknown model {args.model!r}: pick `{SERVED}` (this server's model) or one of "
                           f"{', '.join(TABLE)}", "model")
    return scenario_from_args(args, local=_cached_hardware)


def _cached_hardware():
    """This machine's cached profile: a web request never measures the machine (after the workload's checks,
    so a bad body says what is wrong with it first)."""
    from ridgeline.advisor.local_profile import cached_profile, to_spec
    p = cached_profile()  # read once: the profile checked is the profile used
    if p is None:
        raise AdvisorError(NO_PROFILE, "hardware")
    return to_spec(p)


def _batch(body: dict) -> int:
    b = _value("concurrency", body.get("batch", 1))
    if not 1 <= b <= MAX_BATCH:
        raise AdvisorError(f"batch must be in [1, {MAX_BATCH}], got {b}", "batch")
    return b


@router.get("/console/api/advise")
def options(request: Request):
    """What the forms offer: models, hardware, formats and the CLI's defaults (the lengths cut to fit the
    served model's context when the CLI's do not)."""
    d = {**cli_defaults(), "model": SERVED}
    ctx = state_of(request).engine.arch.max_position_embeddings
    if d["prompt_len"] + d["output_len"] > ctx:
        d["prompt_len"], d["output_len"] = max(1, ctx // 2), max(1, ctx // 4)
    return {"models": [SERVED, *TABLE], "hardware": ["auto", "local", *HARDWARE], "precisions": list(BYTES),
            "weights": ["auto", *BYTES],
            "calculators": [*CALCULATORS, "roofline"], "defaults": d}


@router.post("/console/api/advise/{name}")
def advise(name: str, body: dict, request: Request):
    if name not in CALCULATORS and name != "roofline":
        raise AdvisorError(f"unknown calculator {name!r}; known: {', '.join([*CALCULATORS, 'roofline'])}", "name")
    if name == "roofline" and body.get("live"):
        st = state_of(request)
        hw = parse({"hardware": body.get("hardware", "local")}).hardware
        s = live_scenario(st.engine, st.settings.served_model_name, hw, list(st.metrics.recent),
                          st.async_engine.num_running)
        return finite_or_none({"roofline": roofline_points(s), "workload": s.w.summary(), "hardware": s.hw.name})
    s = scenario(request, parse(body))
    if name == "roofline":
        return finite_or_none({"roofline": roofline_points(s), "workload": s.w.summary(), "hardware": s.hw.name})
    sections, wall, techniques = CALCULATORS[name](s)
    out = {"json": as_json(s, sections, wall, techniques), "text": render(sections, wall, techniques),
           "view": [_view(sec) for sec in sections],
           "techniques_text": render([], None, techniques) if techniques else ""}
    if name == "spec":
        out["curve"] = finite_or_none(spec_curve(s, SPEC_CHART))
        at = spec_curve(s, [_batch(body)])[0]
        out["at_batch"] = finite_or_none(at)
        out["at_batch_text"] = (f"batch {at['batch']}: gain {fmt_ratio(at['gain'])} at k {s.sd.k} (step "
                                f"{fmt_time(at['step'])}, verify {fmt_time(at['verify'])}); best k {at['best_k']} "
                                f"-> {fmt_ratio(at['best_gain'])}")
    return out


def _view(sec) -> dict:
    """A section as the page shows it: each value's CLI line (label, value, [formula = numbers])."""
    return {"key": sec.key, "title": sec.title, "notes": sec.notes,
            "steps": [{**finite_or_none(st.json()), "key": st.key, "text": st.text()} for st in sec.steps]}
