"""Sequential calibration: each decoder layer's Linear inputs measured with every layer before it
already quantized, as GPTQ and AWQ are meant to run (a layer fitted to the float model's inputs is
fitted to inputs the quantized model never produces; its compensation then works against the error
arriving from below, and on the default model one-pass GPTQ measured worse than round-to-nearest).

The model is loaded unquantized in float32 on the module path. Every calibration window's hidden
state (and residual) at the input of the current layer is kept in memory; for layer i:

    stats(i)         run layer i on every window with hooks on its Linears -> their InputStats
    set_weights(i)   the layer's new values (checkpoint names: projections as quantized, norms as
                     folded by AWQ) into the live modules
    advance(i)       run layer i again, now quantized: the inputs of layer i + 1

so the model is run about twice in all, whatever the number of layers. Every window has the same
length, so one KV allocation and one forward context serve them all (a layer's prefill writes the
window's KV for that layer before its attention reads it). The engine is private to the runner:
set_weights repacks Linears the C decoder stack holds pointers to, so only the module path runs it.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ridgeline.errors import InvalidRequestError
from ridgeline.data import corpus
from ridgeline.layers.forward_context import forward_context
from ridgeline.layers.linear import Linear
from ridgeline.quant.calibrate import WINDOW, InputStats, calibration_engine, module_path

_RID = "\0calibration"


class LayerRunner:
    def __init__(self, folder: Path, text: str, max_tokens: int, window: int = WINDOW, progress: bool = True):
        from ridgeline.step_plan import ScheduledSeq
        self.progress = progress
        self.engine = engine = calibration_engine(folder, progress)
        ids = engine.tokenizer.encode(text)
        window = min(window, engine.max_model_len, len(ids))
        self.windows = corpus.windows(ids, window, max_tokens) if window >= 2 else []
        if not self.windows:
            raise InvalidRequestError("the calibration text is empty (it needs at least 2 tokens)", "calibration")
        self.model = engine.runner.model
        self.inner = self.model.model
        self.modules = dict(self.model.named_modules())
        if not engine.kv.allocate(_RID, window):
            raise InvalidRequestError(f"no KV blocks for a {window}-token calibration window", "calibration")
        self._kv = engine.kv
        table, more = engine.kv.seq_tables(_RID)
        seq = ScheduledSeq(_RID, 0, self.windows[0], table, False, None, None, None, window, group_tables=more)
        _, self.positions, self.ctx, _ = engine.runner.prepare([seq])
        with torch.inference_mode():
            self.hidden = [self.inner.embed(torch.tensor(w, dtype=torch.long)) for w in self.windows]
        self.residual: list[torch.Tensor | None] = [None] * len(self.windows)

    @property
    def tokens(self) -> int:
        return sum(map(len, self.windows))

    def close(self) -> None:
        self._kv.free(_RID)

    def stats(self, i: int) -> dict[str, InputStats]:
        """Engine Linear prefix of layer i -> the statistics of its input over every window."""
        layer = self.inner.layers[i]
        out, handles = {}, []
        for m in layer.modules():
            if isinstance(m, Linear):
                st = out[m.prefix] = InputStats.empty(m.in_features)
                handles.append(m.register_forward_pre_hook(lambda _m, args, st=st: st.add(args[0])))
        try:
            for h, r in zip(self.hidden, self.residual):  # the fused norm adds into the residual in place
                self._run(i, h.clone(), None if r is None else r.clone())
        finally:
            for h in handles:
                h.remove()
        return out

    def block_probes(self, i: int, n: int) -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """Layer i's attention and MLP ("self_attn", "mlp") -> (inputs, outputs) on the first n windows."""
        layer = self.inner.layers[i]
        out: dict[str, tuple[list, list]] = {"self_attn": ([], []), "mlp": ([], [])}

        handles = []
        for name, block in (("self_attn", layer.self_attn), ("mlp", layer.mlp)):
            xs, ys = out[name]
            handles += [block.register_forward_pre_hook(lambda _m, args, xs=xs: xs.append(args[-1].clone())),
                        block.register_forward_hook(lambda _m, _args, y, ys=ys: ys.append(y.clone()))]
        try:
            for h, r in list(zip(self.hidden, self.residual))[:n]:
                self._run(i, h.clone(), None if r is None else r.clone())
        finally:
            for h in handles:
                h.remove()
        return out

    def run_block(self, block: nn.Module, xs: list[torch.Tensor], attention: bool) -> list[torch.Tensor]:
        """block (a layer's self_attn, or its mlp when not attention) on each of the windows' inputs xs."""
        with module_path(self.model), forward_context(self.ctx), torch.inference_mode():
            return [block(self.positions, x) if attention else block(x) for x in xs]

    def advance(self, i: int) -> None:
        for w in range(len(self.windows)):
            self.hidden[w], self.residual[w] = self._run(i, self.hidden[w], self.residual[w])

    def _run(self, i: int, hidden: torch.Tensor, residual: torch.Tensor | None):
        with module_path(self.model), forward_context(self.ctx), torch.inference_mode():
            h, r, _ = self.inner.run_layers(self.positions, hidden, residual, i, i + 1)
        return h, r

    def set_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Checkpoint-named float tensors of one layer (every shard of a fused projection's weight given)
        into the live modules: projection weights rebuilt in the engine's layout and repacked, biases and
        norms overwritten."""
        fused: dict[str, list[tuple[int | None, torch.Tensor]]] = {}
        for name, t in tensors.items():
            target, shard = _map_name(self.model, name)
            owner_name, _, param = target.rpartition(".")
            owner = self.modules[owner_name]
            t = self.model.transform_weight(name, t.float())
            if isinstance(owner, Linear) and param == "weight":
                fused.setdefault(owner_name, []).append((shard, t))
            elif isinstance(owner, Linear):
                owner.load(param, t.to(owner.bias.dtype), shard)
            else:
                getattr(owner, param).data.copy_(t.to(getattr(owner, param).dtype))
        for owner_name, shards in fused.items():
            _replace_weight(self.modules[owner_name], shards)


def _map_name(model: nn.Module, name: str) -> tuple[str, int | None]:
    from ridgeline.models.loader import map_name
    target, shard = map_name(model, name)
    if target is None:
        raise ValueError(f"{name} is not a weight of this model")
    return target, shard


def _replace_weight(layer: Linear, shards: list[tuple[int | None, torch.Tensor]]) -> None:
    """A dense float Linear's whole weight from its shards (all of them), repacked as at load."""
    W = torch.empty(layer.out_features, layer.in_features, dtype=torch.float32)
    covered = 0
    for shard, t in shards:
        rows = layer.shard_rows(shard)
        start, n = rows if rows is not None else (0, layer.out_features)
        W[start:start + n] = t
        covered += n
    if covered != layer.out_features:
        raise ValueError(f"{layer.prefix}: {covered} of {layer.out_features} rows given")
    layer.packed = None
    layer.weight = nn.Parameter(W, requires_grad=False)
    layer.format.finish(layer)


def run_layers(runner: LayerRunner, num_layers: int, quantize_layer, desc: str) -> None:
    """For each layer i: quantize_layer(i, stats) -> the checkpoint tensors to set; then advance."""
    for i in tqdm(range(num_layers), desc=desc, unit="layer", disable=not runner.progress):
        runner.set_weights(quantize_layer(i, runner.stats(i)))
        runner.advance(i)
