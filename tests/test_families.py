"""The non-Llama families (Gemma 2, Gemma 3, Phi-3, Phi-4-mini) as declared layer structure: the plain
engine matches transformers on the same weights (prefill logits through chunked prefill, greedy tokens
through chunking and preemption), the C stack runs every layer it can, bitwise the module path, and
names the ones it cannot; each family's bad configs are clear errors before anything is allocated."""
from __future__ import annotations

import json

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import ModelLoadError, UnsupportedArchitectureError
from ridgeline.models.registry import model_class
from ridgeline.weights.hf_config import load_arch_config
from conftest import make_tiny_model
from test_hf_parity import PROMPTS, assert_prefill_matches_transformers, engine_logits, hf_greedy, hf_model


@pytest.mark.parametrize("chunk", [1000, 5])
def test_prefill_logits_match_transformers(tiny_family_model, chunk):
    arch, folder = tiny_family_model
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", max_model_len=256)
    assert_prefill_matches_transformers(llm, folder, chunk)


@pytest.mark.parametrize("options", [
    {},
    {"max_num_batched_tokens": 7},  # chunked prefill mixed with decodes
    {"kv_blocks": 48, "block_size": 4, "max_model_len": 160},  # few blocks: forces preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_transformers(tiny_family_model, options):
    arch, folder = tiny_family_model
    opts = {"kv_cache_memory": "4MiB", "max_model_len": 256, **options}
    if "kv_blocks" in opts:
        a = load_arch_config(folder)
        opts["kv_cache_memory"] = opts.pop("kv_blocks") * 4 * 2 * a.num_layers * a.num_kv_heads * a.head_dim * 4
    llm = LLM(str(folder), dtype="float32", **opts)
    ref = hf_model(folder)
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    for prompt_ids, out in zip(ids, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(ref, prompt_ids, 16)


def test_the_stack_runs_every_layer_it_can_bitwise_the_modules(tiny_family_model):
    arch, folder = tiny_family_model
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", max_model_len=256, max_num_batched_tokens=24)
    model = llm.engine.runner.model.model
    paths = llm.info.layer_paths
    assert all(p is None for p in paths) and model.stack is not None
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3)

    def run():
        return [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]
    with_stack = run()
    segments, model.segments = model.segments, [(0, len(model.layers), False)]
    assert run() == with_stack  # token ids and logprobs, exactly
    model.segments = segments


def test_gemma3_layers_declare_their_own_rotary_and_window(tiny_family_model):
    arch, folder = tiny_family_model
    if arch != "gemma3":
        pytest.skip("Gemma 3's local/global layers")
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", max_model_len=256)
    layers = llm.engine.runner.model.model.layers
    assert [layer.self_attn.attn.window for layer in layers] == [6, 6, 6, None]
    local, glob = layers[0].self_attn.rotary, layers[3].self_attn.rotary
    assert layers[1].self_attn.rotary is local and glob is not local
    assert not torch.equal(local.cos_sin, glob.cos_sin)
    assert layers[0].attn_out_norm is not None and layers[0].mlp_out_norm is not None


def _config(tmp_path, arch: str, **changes) -> dict:
    folder = make_tiny_model(tmp_path / arch, arch)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_longrope_factor_lists_of_the_wrong_length_are_refused(tmp_path):
    folder = make_tiny_model(tmp_path / "phi", "phi3")
    cfg = json.loads((folder / "config.json").read_text())
    key = "rope_parameters" if "rope_parameters" in cfg else "rope_scaling"
    cfg[key]["short_factor"] = [1.0] * 5
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="short_factor has 5 factors; 16 rotary dims need 8"):
        load_arch_config(folder)


def test_an_unknown_activation_is_refused(tmp_path):
    folder = _config(tmp_path, "gemma2", hidden_activation="relu2")
    with pytest.raises(ModelLoadError, match="activation 'relu2' is not supported"):
        load_arch_config(folder)


def test_layer_types_that_do_not_cover_the_layers_are_refused(tmp_path):
    folder = _config(tmp_path, "gemma3", layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ModelLoadError, match="2 layer_types for 4 layers"):
        load_arch_config(folder)


def test_unknown_architectures_list_the_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="Gemma3ForCausalLM.*Phi3ForCausalLM"):
        model_class("GPTNeoXForCausalLM")
    with pytest.raises(UnsupportedArchitectureError, match="multi-head latent attention"):
        model_class("DeepseekV3ForCausalLM")


def test_gemma_configs_without_layer_types_take_the_family_pattern(tmp_path):
    """transformers 4's Gemma 2 and Gemma 3 configs: windows from the family (every 2nd / 6th layer
    global) and Gemma 3's local rotary base from rope_local_base_freq."""
    folder = _config(tmp_path, "gemma2", num_hidden_layers=4)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["layer_types"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_arch_config(folder).layer_windows == (6, None, 6, None)
    folder = _config(tmp_path, "gemma3")
    cfg = json.loads((folder / "config.json").read_text())
    for k in ("layer_types", "rope_parameters", "rope_scaling"):
        cfg.pop(k, None)
    cfg.update(num_hidden_layers=7, rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=6)
    (folder / "config.json").write_text(json.dumps(cfg))
    arch = load_arch_config(folder)
    assert arch.layer_windows == (6, 6, 6, 6, 6, None, 6)
    assert arch.rope_theta == 1e6 and arch.local_rope == (1e4, None)


def test_the_text_half_of_a_gemma3_image_text_checkpoint_runs(tmp_path):
    """Gemma3ForConditionalGeneration: its nested text config and `language_model.` weight names load as
    Gemma 3 text; the vision tower's weights are never read; logits equal transformers' on text."""
    import transformers
    from conftest import CHATML, _byte_tokenizer
    tok = _byte_tokenizer()
    text = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
                max_position_embeddings=512, layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
                bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=300, boi_token_index=301, eoi_token_index=302)
    torch.manual_seed(0)
    ref = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    ref.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML, "add_bos_token": False}))
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory="4MiB")
    assert llm.engine.runner.model.cfg.architecture == "Gemma3ForConditionalGeneration"
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    for prompt_ids, got in zip(ids, engine_logits(llm, ids, 7)):
        with torch.no_grad():
            want = ref(input_ids=torch.tensor([prompt_ids])).logits[0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_head_dim_256_one_kv_head_odd_widths(tmp_path):
    """Gemma 3's head_dim 256 with one KV head, a hidden size that is not a multiple of 64 and a vocabulary
    that is not a multiple of the head's 48-column groups: every layer in the C stack, bitwise the module
    path, and transformers' logits."""
    folder = make_tiny_model(tmp_path / "g3", "gemma3", head_dim=256, num_key_value_heads=1, hidden_size=80,
                             query_pre_attn_scalar=256, vocab_size=397)
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="8MiB", max_model_len=256)
    assert all(p is None for p in llm.info.layer_paths)
    assert_prefill_matches_transformers(llm, folder, 7)
    model = llm.engine.runner.model.model
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)

    def run():
        return [(c.token_ids, [(lp.token_id, lp.logprob) for lp in c.logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]
    with_stack = run()
    model.segments = [(0, len(model.layers), False)]
    assert run() == with_stack
