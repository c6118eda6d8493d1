"""The child of test_gguf_fuzz.py: `python gguf_fuzz_child.py MANIFEST` loads each mutated GGUF file the
manifest describes the way Ridgeline opens a .gguf (resolve -> converted folder, its config, tokenizer and
tensors, and the model built from the file's own blocks), under an address-space limit set here before
anything else is loaded, and prints one JSON line before and one after each file.

A line {"id": i, "outcome": "loaded" | "refused" | "error", "detail": ...} follows {"id": i, "start": true}:
refused is a ModelLoadError; error is any other exception (with its traceback). A crash or a hang leaves a
start line with no outcome after it, which names the file.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import traceback
from pathlib import Path


def mutate(base: bytes, m: dict) -> bytes:
    data = bytearray(base)
    for offset, hexbytes in m.get("edits", ()):
        patch = bytes.fromhex(hexbytes)
        data[offset:offset + len(patch)] = patch
    if m.get("truncate") is not None:
        del data[m["truncate"]:]
    return bytes(data)


def load(path: Path) -> None:
    import torch

    from ridgeline.layers.kernel_plan import TORCH_ONLY
    from ridgeline.models.loader import build_model, folder_tensors
    from ridgeline.layers.build_options import BuildOptions
    from ridgeline.models.registry import model_class
    from ridgeline.gguf.load import kept_blocks
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.models.resolve import resolve_model_source
    from ridgeline.weights.tokenizer import Tokenizer

    folder, gguf = resolve_model_source(str(path), progress=False)
    arch = load_arch_config(folder)
    model_class(arch.architecture)
    Tokenizer(folder).encode("hello world, 12 times")
    for _ in folder_tensors(folder, arch):  # every tensor decoded from the file, as --quantization none reads it
        pass
    formats, tensors = kept_blocks(gguf, arch, model_class(arch.architecture).packed, (), "f32", TORCH_ONLY)
    opts = BuildOptions(TORCH_ONLY, torch.float32, torch.float32, "auto", formats)
    build_model(arch, folder, opts, torch.device("cpu"), arch.max_position_embeddings, tensors)


def main() -> None:
    manifest = json.loads(Path(sys.argv[1]).read_text())
    limit = manifest["address_space"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ["RIDGELINE_HOME"] = manifest["home"]  # the model cache: converted folders go there
    from ridgeline.errors import ModelLoadError

    base = Path(manifest["base"]).read_bytes()
    work = Path(manifest["work"])
    for m in manifest["mutations"]:
        print(json.dumps({"id": m["id"], "start": True}), flush=True)
        path = work / f"m{m['id']:05d}.gguf"  # a new name each time: the converted folder is keyed by path
        path.write_bytes(mutate(base, m))
        try:
            load(path)
            outcome, detail = "loaded", ""
        except ModelLoadError as e:
            outcome, detail = "refused", str(e)[:300]
        except Exception:  # MemoryError included: anything but a clean refusal fails the test
            outcome, detail = "error", traceback.format_exc()[-3000:]
        finally:
            path.unlink()
            shutil.rmtree(Path(manifest["home"]) / "converted", ignore_errors=True)
        print(json.dumps({"id": m["id"], "outcome": outcome, "detail": detail}), flush=True)
    # VmHWM: this process's own peak (ru_maxrss would carry over the parent's peak from before exec)
    peak = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    print(json.dumps({"done": True, "peak_rss": peak}), flush=True)


if __name__ == "__main__":
    main()
