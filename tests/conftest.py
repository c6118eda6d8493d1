"""Shared fixtures: tiny random-weight HF models of each supported architecture."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

@pytest.fixture(autouse=True, scope="module")
def _own_deployment_secret():
    """Each test module starts with the process's deployment secret as it found it: a module that
    builds a replica (which adopts its launcher's secret) must not hand it to the next module."""
    from ridgeline.utils import internal_auth
    saved = internal_auth._DEPLOYMENT  # noqa: SLF001
    yield
    internal_auth._DEPLOYMENT = saved  # noqa: SLF001


VOCAB = 384  # 256 byte tokens + specials + padding room


def _byte_tokenizer() -> "tokenizers.Tokenizer":
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


CHATML = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


# small expert counts and widths; top-k above 1 so the router's weights and sums matter
MOE_SHAPES = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48),
    "qwen2_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=80, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[1]),  # layer 1 keeps a dense MLP
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True),
}
MOE_ARCHS = tuple(MOE_SHAPES)

# each non-Llama family's switches, small: Gemma 3 local/global layers with their own rotary bases, q/k norms
# and a head_dim past the hidden size's share; Gemma 2 soft-caps; Phi-3 fused checkpoint tensors with
# LongRoPE; Phi-4-mini's partial rotary
FAMILY_SHAPES = {
    "gemma2": dict(head_dim=16, sliding_window=6, query_pre_attn_scalar=12, num_hidden_layers=4,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0, tie_word_embeddings=True),
    "gemma3": dict(head_dim=32, sliding_window=6, query_pre_attn_scalar=24, num_hidden_layers=4,
                   layer_types=["sliding_attention"] * 3 + ["full_attention"], tie_word_embeddings=True,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
    "phi3": dict(pad_token_id=0, original_max_position_embeddings=256, tie_word_embeddings=False,
                 rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.0, 1.1, 1.0, 1.2, 1.4],
                               "long_factor": [2.0] * 8}),
    "phi4": dict(pad_token_id=0, partial_rotary_factor=0.75, original_max_position_embeddings=256, tie_word_embeddings=True,
                 rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 1.2, 1.1, 1.0],
                               "long_factor": [2.0] * 6}),
    # sinks, alternating windowed and global layers, YaRN (its default), biased router and experts, clamped SwiGLU
    "gpt_oss": dict(head_dim=16, sliding_window=6, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=64, swiglu_limit=0.5, tie_word_embeddings=False),
}
FAMILY_ARCHS = tuple(FAMILY_SHAPES)


def transformers_folder(folder: Path) -> Path:
    """A folder transformers can read: a converted GGUF model's folder holds no weights (Ridgeline reads
    them from the file), so they are written into it for transformers first."""
    from ridgeline.gguf.convert import ensure_converted
    from ridgeline.gguf.source import source_gguf
    linked = source_gguf(Path(folder))
    return ensure_converted(linked, progress=False, weights=True) if linked else Path(folder)


def make_tiny_model(folder: Path, arch: str, seed: int = 0, **overrides) -> Path:
    import transformers

    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
               "mixtral": transformers.MixtralConfig, "qwen2_moe": transformers.Qwen2MoeConfig,
               "qwen3_moe": transformers.Qwen3MoeConfig, "gemma2": transformers.Gemma2Config,
               "gemma3": transformers.Gemma3TextConfig, "phi3": transformers.Phi3Config,
               "phi4": transformers.Phi3Config, "gpt_oss": transformers.GptOssConfig}[arch]
    tok = _byte_tokenizer()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-5, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=arch == "qwen2",
              initializer_range=0.1)
    if arch == "mistral":
        kw["sliding_window"] = 24
    kw.update(MOE_SHAPES.get(arch, {}))
    kw.update(FAMILY_SHAPES.get(arch, {}))
    if arch in ("qwen3", "qwen3_moe"):
        kw["head_dim"] = 16
    kw.update(overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg_cls(**kw), dtype=torch.float32)
    with torch.no_grad():  # larger, non-uniform logits so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0 if arch not in ("gemma2", "gemma3") else 0.5)
        for name, p in model.named_parameters():  # norms off their init (Gemma's is 1 + 0: all alike otherwise)
            if arch in FAMILY_SHAPES and name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
            if name.endswith(("sinks", "_bias")):  # GPT-OSS's sinks and expert biases (zero at init): large enough to matter
                p.add_(torch.randn_like(p) * (1.0 if name.endswith("sinks") else 0.1))
    model.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML, "add_bos_token": False}))
    return folder


@pytest.fixture(scope="session", params=["llama", "qwen2", "mistral"])
def tiny_model(request, tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return request.param, make_tiny_model(folder, request.param)


@pytest.fixture(scope="session", params=["qwen3", *MOE_ARCHS])
def tiny_new_model(request, tmp_path_factory) -> tuple[str, Path]:
    """Qwen3 (per-head q/k norm) and the sparse-MLP architectures."""
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return request.param, make_tiny_model(folder, request.param)


@pytest.fixture(scope="session", params=FAMILY_ARCHS)
def tiny_family_model(request, tmp_path_factory) -> tuple[str, Path]:
    """The families that are not Llama-shaped: Gemma 2, Gemma 3, Phi-3, Phi-4-mini."""
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return request.param, make_tiny_model(folder, request.param)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_head(tiny_llama, tmp_path_factory) -> Path:
    """An EAGLE head for tiny_llama, trained for a few steps by `ridgeline train-draft`."""
    from ridgeline.cli import main
    out = tmp_path_factory.mktemp("eagle") / "head"
    assert main(["train-draft", str(tiny_llama), "--out", str(out), "--tokens", "2500", "--seed", "3", "--epochs",
                 "2", "--max-reply-tokens", "48", "--dtype", "float32", "--draft-vocab", "200", "--quiet"]) == 0
    return out


SERVER_OPTS = dict(dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    """An engine on the tiny Llama with a small pool, one per test module."""
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **SERVER_OPTS))


@pytest.fixture(scope="module")
def tiny_server(tiny_engine):
    """tiny_engine behind the OpenAI server (model name "tiny") on a thread; yields the ServerThread."""
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    with ServerThread(build_app(tiny_engine, ServerSettings("tiny", quiet=True))) as s:
        yield s
