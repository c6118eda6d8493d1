"""Pipeline-parallel arithmetic with the engine's own rules (ridgeline/distributed/stages.py): the
stages' layer ranges, each stage's weights (its layers; the embedding on the first stage, the final
norm and LM head on the last; a tied head is the embedding table again) and KV (its layers' share),
the bubble of a forward-only pipeline, (N-1) / (M+N-1) at the engine's default of one micro-batch
per stage (fewer when fewer requests decode), and the bytes a decode step sends between stages."""
from __future__ import annotations

from ridgeline.advisor.calc import Section
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import INTER_NODE_BW, INTER_NODE_LATENCY
from ridgeline.advisor.memory import kv_needed
from ridgeline.advisor.units import BYTES, fmt_bytes, fmt_time
from ridgeline.distributed.stages import bubble_fraction, microbatch_count, p2p_bytes_per_step, stage_layout
from ridgeline.errors import InvalidRequestError


def stage_weight_params(spec, stages: int) -> list[float]:
    """Parameters each stage holds."""
    try:
        layout = stage_layout(spec.num_layers, stages)
    except InvalidRequestError as e:
        raise AdvisorError(e.message, "pipeline_parallel_size") from None
    per_layer = (spec.num_params - spec.embed_params - spec.head_params - spec.hidden_size) / spec.num_layers
    out = []
    for st in layout:
        p = len(st.layers) * per_layer
        if st.first:
            p += spec.embed_params
        if st.last:
            p += spec.hidden_size + (spec.head_params or spec.embed_params)  # a tied head: the table again
        out.append(p)
    return out


def pipeline_section(s) -> Section | None:
    """The per-stage arithmetic of the scenario's layout, when it has more than one stage."""
    pp, tp, spec, w = s.layout.pp, s.layout.tp, s.spec, s.w
    if pp == 1:
        return None
    sec = Section("pipeline", f"Pipeline: {pp} stages of contiguous layers"
                              + (f", each over TP{tp}" if tp > 1 else ""))
    layout = stage_layout(spec.num_layers, pp)
    wb, kv = BYTES[w.weight_precision], kv_needed(spec, w, s.concurrency)
    for st, params in zip(layout, stage_weight_params(spec, pp)):
        stage_kv = kv * len(st.layers) / spec.num_layers
        sec.add(f"stage{st.index}_bytes", f"{st.describe()}: weights + KV per device",
                "(stage params * bytes + KV * stage layers / layers) / tp",
                f"({fmt_bytes(params * wb)} + {fmt_bytes(stage_kv)}) / {tp}", (params * wb + stage_kv) / tp, "B")
    m = microbatch_count(None, pp, max(1, int(s.concurrency)))
    sec.add("bubble", f"bubble fraction at {m} micro-batches per step (the engine's default)",
            "(N - 1) / (M + N - 1)", f"({pp} - 1) / ({m} + {pp} - 1)", bubble_fraction(pp, m))
    nbytes = p2p_bytes_per_step(spec.hidden_size, s.concurrency, pp)
    sec.add("p2p_bytes", f"bytes between stages per decode step ({s.concurrency:g} rows)",
            "(N - 1) * 2 (hidden, residual) * rows * hidden * 4 (fp32)",
            f"({pp} - 1) * 2 * {s.concurrency:g} * {spec.hidden_size} * 4", nbytes, "B")
    across = tp * pp > s.hw.devices_per_node
    bw, lat = (INTER_NODE_BW, INTER_NODE_LATENCY) if across or not s.hw.link_bw else (s.hw.link_bw, s.hw.link_latency)
    msgs = (pp - 1) * 2 * m + 1
    sec.add("p2p_time", "point-to-point time per decode step", "messages * latency + bytes / link",
            f"{msgs} * {fmt_time(lat)} + {fmt_bytes(nbytes)} / {fmt_bytes(bw)}/s", msgs * lat + nbytes / bw, "s")
    sec.note("per-token latency does not drop with pipeline stages (every token crosses every stage); "
             "throughput grows as micro-batches keep the stages busy")
    return sec
