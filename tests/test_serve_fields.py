"""Fail closed: every request field that names a peer's feature (OpenAI, vLLM, SGLang, llama.cpp) is
enforced (a field of the request model) or refused with a 400 naming it; never ignored. Truly unknown
fields are ignored and named in the x-ridgeline-ignored-fields header (streamed and not)."""
from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from ridgeline.serve.fields import ACCEPTED, IGNORED_HEADER, REFUSED, ignored_header
from ridgeline.serve.protocol import BodyError, ChatCompletionRequest, ChatMessage, CompletionRequest

# Written out here, not read from the table: a field dropped from the table fails this test unless
# a request model enforces it.
PEER_FIELDS = """
response_format tools tool_choice parallel_tool_calls functions function_call suffix audio modalities prediction
web_search_options reasoning_effort verbosity store service_tier metadata safety_identifier prompt_cache_key
logprobs top_logprobs logit_bias max_completion_tokens seed user stream_options n echo best_of
structured_outputs guided_json guided_regex guided_choice guided_grammar structural_tag guided_decoding_backend
guided_whitespace_pattern use_beam_search length_penalty spaces_between_special_tokens truncate_prompt_tokens
prompt_logprobs allowed_token_ids bad_words add_generation_prompt continue_final_message add_special_tokens
documents chat_template chat_template_kwargs mm_processor_kwargs media_io_kwargs prompt_embeds priority
request_id logits_processors return_tokens_as_token_ids return_token_ids kv_transfer_params vllm_xargs
include_reasoning thinking_token_budget max_reasoning_tokens lora_request top_k min_p repetition_penalty stop_token_ids
include_stop_str_in_output ignore_eos min_tokens skip_special_tokens cache_salt
regex ebnf json_schema no_stop_trim stop_regex separate_reasoning stream_reasoning custom_logit_processor
return_hidden_states rid session_params lora_path
grammar n_predict typical_p tfs_z mirostat mirostat_tau mirostat_eta top_n_sigma dynatemp_range
dynatemp_exponent repeat_penalty repeat_last_n penalize_nl dry_multiplier dry_base dry_allowed_length
dry_penalty_last_n dry_sequence_breakers xtc_probability xtc_threshold n_probs post_sampling_probs samplers
cache_prompt id_slot n_keep t_max_predict_ms
stream_options.continuous_usage_stats messages[].tool_calls messages[].tool_call_id messages[].function_call
messages[].audio messages[].reasoning_content messages[].refusal
""".split()
ROUTES = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
ON = "on"  # a value no field takes as "off"


def _base(route: str) -> dict:
    if route == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return {"model": "m", "prompt": "hi"}


def _with(route: str, name: str, value) -> dict:
    body = _base(route)
    if name.startswith("messages[]."):
        body["messages"][0][name.split(".", 1)[1]] = value
    elif "." in name:
        head, rest = name.split(".")
        body.update({"stream": True, head: {rest: value}})
    else:
        body[name] = value
    return body


def _fate(route: str, name: str) -> str:
    """'enforced', 'accepted', 'refused' or 'unlisted'."""
    model = ROUTES[route]
    if name in model.model_fields or (route == "chat" and name.startswith("messages[].")
                                       and name.split(".", 1)[1] in ChatMessage.model_fields):
        return "enforced"
    if name in ACCEPTED:
        return "accepted"
    return "refused" if name in REFUSED else "unlisted"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", PEER_FIELDS)
def test_every_peer_field_is_enforced_or_refused(route, name):
    if name.startswith("messages[].") and route != "chat":
        return  # completions have no messages
    fate = _fate(route, name)
    assert fate != "unlisted", f"{name}: neither a field of the {route} request nor in serve/fields.py"
    if fate == "refused":
        with pytest.raises(BodyError) as e:
            ROUTES[route].model_validate(_with(route, name, ON))
        assert (e.value.param, e.value.code, e.value.status) == (name, "unsupported_parameter", 400)
        assert name.split(".")[-1] in e.value.message
    else:
        try:
            ROUTES[route].model_validate(_with(route, name, ON))
        except ValidationError:
            pass  # enforced: a wrong type is a 400 of its own (tests/test_server_errors.py)
        if fate == "accepted":
            assert ignored_header(ROUTES[route].model_validate(_with(route, name, ON)).model_extra) == {}


def test_the_table_has_no_field_the_test_does_not_list():
    assert set(REFUSED) | set(ACCEPTED) <= set(PEER_FIELDS)


@pytest.mark.parametrize("name", [n for n, p in REFUSED.items() if p.off])
def test_off_values_are_accepted(name):
    route = "completions" if name in ChatCompletionRequest.model_fields else "chat"
    for off in REFUSED[name].off:
        ROUTES[route].model_validate(_with(route, name, off))
        ROUTES[route].model_validate(_with(route, name, None))


def test_off_values_are_type_exact():
    with pytest.raises(BodyError):  # 0 is off for priority, False is not an integer
        CompletionRequest.model_validate(_with("completions", "priority", False))
    CompletionRequest.model_validate(_with("completions", "length_penalty", 1))  # 1 == 1.0 in JSON


def test_unknown_fields_are_named_in_a_header():
    body = CompletionRequest.model_validate({**_base("completions"), "zeta": 1, "alpha\n": 2, "metadata": {}})
    assert ignored_header(body.model_extra) == {IGNORED_HEADER: "alpha\\n, zeta"}
    assert ignored_header(CompletionRequest.model_validate(_base("completions")).model_extra) == {}


@pytest.mark.parametrize("stream", [False, True])
def test_server_sends_the_header_and_refuses_peer_fields(tiny_server, stream):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": stream, "my_flag": True}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.headers[IGNORED_HEADER] == "my_flag"
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "stream": stream})
        assert r.status_code == 200 and IGNORED_HEADER not in r.headers
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "stream": stream, "chat_template_kwargs": {"a": 1}})
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("chat_template_kwargs",
                                                                             "unsupported_parameter")


def test_the_unsupported_page_names_every_field():
    from pathlib import Path
    page = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "unsupported.md").read_text()
    missing = [n for n in [*REFUSED, *ACCEPTED] if f"`{n}`" not in page]
    assert not missing, f"docs/guide/unsupported.md does not name {missing}"
