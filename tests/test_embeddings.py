"""POST /v1/embeddings: OpenAI's shape and client, the served model's last-token hidden state normalized (the
same vector transformers computes), every input form, and bad input a 400 that harms no other request."""
import base64
import struct

import httpx
import openai
import pytest
import torch


@pytest.fixture(scope="module")
def server(tiny_engine):
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    with ServerThread(build_app(tiny_engine, ServerSettings("tiny", quiet=True))) as s:
        yield s


def _post(server, **body):
    return httpx.post(server.url + "/v1/embeddings", json={"model": "tiny", **body}, timeout=60)


def test_the_vector_is_the_last_tokens_hidden_state_normalized(server, tiny_llama, tiny_engine):
    import transformers
    ids = [5, 17, 99, 3, 42]
    r = _post(server, input=ids)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    got = torch.tensor(body["data"][0]["embedding"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        h = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
    want = h / h.norm()
    assert got.shape == (tiny_engine.arch.hidden_size,) and abs(float(got.norm()) - 1) < 1e-5
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


def test_every_input_form_and_the_openai_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    one = client.embeddings.create(model="tiny", input="hello there")
    many = client.embeddings.create(model="tiny", input=["hello there", "a second text"])
    assert [d.index for d in many.data] == [0, 1] and many.data[0].embedding == pytest.approx(one.data[0].embedding,
                                                                                                abs=1e-6)
    assert many.data[0].embedding != many.data[1].embedding
    lists = _post(server, input=[[1, 2, 3], [4, 5]]).json()
    assert len(lists["data"]) == 2 and lists["usage"]["prompt_tokens"] == 5
    b64 = _post(server, input="hello there", encoding_format="base64").json()["data"][0]["embedding"]
    raw = base64.b64decode(b64)
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(one.data[0].embedding, abs=1e-6)


@pytest.mark.parametrize("body, field", [({"input": ""}, "input"), ({"input": []}, "input"),
                                         ({"input": [[1, 2], []]}, "input"), ({"input": [10 ** 9]}, "input"),
                                         ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                                         ({"input": "x", "dimensions": 3}, "dimensions"),
                                         ({"input": [1] * 5000}, "prompt"), ({"input": "x", "model": "other"}, "model"),
                                         ({"input": "x", "normalize": "no"}, "normalize")])
def test_bad_input_is_a_400_naming_the_field(server, body, field):
    r = _post(server, **body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    if field is not None:
        assert err["param"] == field, err
    assert _post(server, input="still serving").status_code == 200


def test_unnormalized_and_unknown_fields(server):
    plain = _post(server, input=[3, 4, 5], normalize=False)
    assert plain.status_code == 200 and abs(torch.tensor(plain.json()["data"][0]["embedding"]).norm() - 1) > 1e-3
    r = _post(server, input="x", pooling="mean")  # not a field of this route: ignored, and said so
    assert r.status_code == 200 and r.headers["x-ridgeline-ignored-fields"] == "pooling"


def _pooled_folder(tiny_llama, tmp_path, config: dict):
    """The tiny model as a sentence-transformers folder whose Pooling module says `config`."""
    import json
    import shutil
    folder = tmp_path / "st"
    shutil.copytree(tiny_llama, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **config}))
    return folder


@pytest.mark.parametrize("config, flag, want", [({"pooling_mode_mean_tokens": True}, "auto", "mean"),
                                                ({"pooling_mode_cls_token": True}, "auto", "cls"),
                                                ({"pooling_mode_mean_tokens": True}, "last", "last"),
                                                ({}, "cls", "cls")])
def test_pooling_follows_the_folder_or_the_flag(tiny_llama, tmp_path, config, flag, want):
    """--pooling auto reads a sentence-transformers folder's Pooling config; a flag value wins over it."""
    import transformers
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder = _pooled_folder(tiny_llama, tmp_path, config)
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, dtype="float32", kv_cache_memory="2MiB"))
    ids = [5, 17, 99, 3, 42]
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True, pooling=flag))) as s:
        got = torch.tensor(_post(s, input=ids).json()["data"][0]["embedding"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        h = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    v = {"last": h[-1], "cls": h[0], "mean": h.mean(0)}[want]
    torch.testing.assert_close(got, v / v.norm(), atol=2e-4, rtol=0)


def test_a_pooling_it_cannot_compute_is_named_at_start(tiny_llama, tmp_path):
    from ridgeline.errors import ModelLoadError
    from ridgeline.serve.pooling import pooling_of
    folder = _pooled_folder(tiny_llama, tmp_path, {"pooling_mode_max_tokens": True})
    with pytest.raises(ModelLoadError, match="pooling_mode_max_tokens.*--pooling"):
        pooling_of("auto", folder)
    assert pooling_of("mean", folder) == "mean" and pooling_of("auto", tiny_llama) == "last"
