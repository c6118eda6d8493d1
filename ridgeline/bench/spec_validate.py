"""`ridgeline advise spec --validate`: the speculative gain the roofline predicts by batch size beside
the gain measured on this machine (registered into the advisor's CLI by bench/cli.py: the
measuring lives here, the arithmetic in advisor/speculative.py and advisor/roofline.py).

For each batch size the engine decodes the workload's prompts with speculation pinned off and at k
(the same engine, alternated), as `ridgeline bench spec` does. From the drafted runs it takes what
the roofline cannot know: the acceptance alpha (per tried draft), the drafts per verification k'
(a proposer may stop short of k) and the proposer's own time per step as a fraction of a plain
step, c_draft per drafted position. The prediction is the advisor's gain (advisor/speculative.py):
E(alpha, k') x t_decode / (t_verify + c_draft k' t_decode), the two step times from the roofline on
this machine's measured profile (no host overhead: the C decoder stack makes one call a step), so
where it misses, the verification's cost by batch size (rows that are free below the ridge and
full price past it) is what the model gets wrong. The measured speed-up is decode tokens per second
against the plain runs'.
"""
from __future__ import annotations

import statistics

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.roofline import Platform, decode_step, verify_step
from ridgeline.advisor.speculative import gain
from ridgeline.advisor.units import precision

def add_spec_validate_args(p) -> None:
    g = p.add_argument_group("validation (runs the engine on this machine)")
    g.add_argument("--validate", dest="calc_validate", action="store_true",
                   help="measure speculative decoding by batch size now and print it beside the roofline's "
                        "prediction from the measured acceptance and draft cost (--model, default the shipped "
                        "smollm2-135m; --draft-len is k)")
    g.add_argument("--speculative-method", default="eagle", metavar="METHOD",
                   help="--validate: the proposer (ngram, eagle, layer-skip, draft, chains as ngram+eagle)")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="--validate: the draft model or head (default: none; eagle finds the model's shipped head)")
    g.add_argument("--workload", default="chat", choices=["chat", "code-edit", "text-edit"],
                   help="--validate: the prompts (as `ridgeline bench spec`)")
    g.add_argument("--batch-sizes", default="1,4,16,64", metavar="B,B,...", help="--validate: batch sizes")
    g.add_argument("--requests", type=int, default=8, metavar="N",
                   help="--validate: prompts per batch size at least (batches run one after another)")
    g.add_argument("--repeats", type=int, default=2, metavar="N", help="--validate: runs per setting (median)")
    g.add_argument("--dtype", dest="spec_dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="--validate: dtype")


def _batches(text: str) -> list[int]:
    try:
        out = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        out = []
    if not out or out[0] < 1:
        raise AdvisorError("--batch-sizes needs positive batch sizes, e.g. 1,4,16,64", "batch_sizes")
    return out


def run_spec_validate(args) -> int:
    from ridgeline.engine.run import start_engine
    from ridgeline.advisor.local_profile import local_hardware
    from ridgeline.advisor.model_config import spec_from_arch
    from ridgeline.bench.spec_runs import Setting, expected_tokens, repeated_runs, summarize, timed_run
    from ridgeline.bench.workloads import make_workload

    batches, k = _batches(args.batch_sizes), args.draft_len
    if k < 1 or args.requests < 1 or args.repeats < 1:
        raise AdvisorError("--validate needs --draft-len >= 1, --requests >= 1 and --repeats >= 1")
    hw = local_hardware(refresh=args.reprofile)
    eng = start_engine(args.model, dtype=args.spec_dtype, quantization="none",
                       speculative_method=args.speculative_method, draft_model=args.draft_model,
                       num_speculative_tokens=k, speculative_controller="off", max_num_seqs=max(256, batches[-1]))
    info = eng.info
    weights, kv = precision(args.spec_dtype), precision(str(info.kv_dtype).removeprefix("torch."))
    pl = Platform(spec_from_arch(eng.arch, str(args.model)), hw, weights, kv, ops_per_step=0)
    print(info.summary())
    print(f"profile    {hw.name}: read {hw.bandwidth / 1e9:.1f} GB/s, {pl.weights} GEMM "
          f"{hw.flops.get(pl.weights, 0) / 1e9:.0f} GFLOP/s ({hw.source})")
    prompts = make_workload(args.workload, eng.tokenizer, max(batches + [args.requests]), seed=0)
    off, on = Setting(args.speculative_method, 0), Setting(args.speculative_method, k)
    for s in (off, on):  # warm-up: kernels, the proposer's first request
        timed_run(eng, prompts[:2], s, 16, True)
    out_len = args.output_len
    ctx = statistics.mean(len(p) for p in prompts) + out_len / 2
    print(f"\n{args.speculative_method}, k = {k}, {args.workload}, {out_len} tokens per request, greedy; "
          f"median of {args.repeats}; context ~{ctx:.0f} tokens")
    print(f"{'batch':>5} {'alpha':>6} {'k_eff':>6} {'c_draft':>8} {'verify/decode':>14} {'predicted':>10} "
          f"{'measured':>9} {'error':>7}")
    for B in batches:
        runs = repeated_runs(eng, prompts[:max(B, args.requests)], B, [off, on], args.repeats, out_len, True)
        row = summarize(on, runs[on], runs[off])
        if "acceptance" not in row:
            print(f"{B:>5}  nothing drafted: no prediction")
            continue
        alpha, k_eff = min(row["acceptance"], 0.999), max(row["k_mean"], 1.0)
        plain_step = statistics.median(r.step_time for r in runs[off])
        verify_steps = sum(r.spec.steps for r in runs[on])
        c_draft = sum(r.spec.draft_time for r in runs[on]) / verify_steps / plain_step / k_eff
        pred = gain(pl, B, ctx, alpha, k_eff, c_draft)
        ratio = verify_step(pl, B, ctx, k_eff).total / decode_step(pl, B, ctx).total
        got = row["speedup"]
        print(f"{B:>5} {alpha:>6.2f} {k_eff:>6.2f} {c_draft:>8.3f} {ratio:>14.2f} {pred:>9.2f}x {got:>8.2f}x "
              f"{(pred - got) / got:>+7.0%}")
    print("predicted = E(alpha, k_eff) x t_decode / (t_verify + c_draft x k_eff x t_decode), E = (1 - alpha^(k+1)) "
          "/ (1 - alpha) = " + ", ".join(f"{a:.1f}: {expected_tokens(a, k):.2f}" for a in (0.3, 0.5, 0.7))
          + f" at k = {k}; t_verify / t_decode from the roofline; error = (predicted - measured) / measured")
    return 0
