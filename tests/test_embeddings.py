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
