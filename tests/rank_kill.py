"""A distributed LLM script whose rank 1 is killed after a first generation: rank 0 must exit
non-zero naming the dead rank (shared by the tensor- and pipeline-parallel tests)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from ridgeline.entrypoints.llm import LLM
    from ridgeline.sampling_params import SamplingParams
    llm = LLM(sys.argv[1], **{sys.argv[2]: 2}, dtype="float32", kv_cache_memory=8 << 20, progress=False)
    p = SamplingParams(max_tokens=4, temperature=0)
    llm.generate([[5, 6, 7]], p, use_tqdm=False)
    print("generated", flush=True)
    os.kill(getattr(llm.info, sys.argv[3]).worker_pids[0], signal.SIGKILL)
    while True:  # a step either raises the rank failure or the watchdog ends the process
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), use_tqdm=False)
""")


def kill_rank_1(folder, size_option: str, info_field: str, dead: str) -> None:
    """Run the script with LLM(size_option=2); assert rank 0 saw `dead` (how rank 1 is named) die."""
    root = Path(__file__).resolve().parents[1]
    # the timeout is only a safety net: the exit is driven by the rank's death, never by a clock
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), size_option, info_field], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert "generated" in r.stdout, r.stderr[-2000:]
    assert r.returncode != 0
    assert dead in r.stderr and "died" in r.stderr, r.stderr[-2000:]
