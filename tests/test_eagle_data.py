"""Training data for an EAGLE head from fixed text (spec/train_text.py): teacher-forced hidden states
over plain chunks and chat turns, a text disjoint from what is scored and benchmarked, and the data
cache of `ridgeline train-draft`."""
from __future__ import annotations

import json

import pytest
import torch

from ridgeline.engine.run import start_engine
from ridgeline.errors import InvalidRequestError
from ridgeline.speculative import train_text
from ridgeline.weights.tokenizer import Tokenizer


def test_paragraphs_take_their_title_line_as_topic(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("Iceland\n\nThe island was settled in the ninth century by people from Norway.\n\n"
                 "Its economy rests on fishing, tourism and cheap geothermal power for smelters.\n\n\n"
                 "A paragraph without a title line before it, longer than eight words.\n")
    f2 = tmp_path / "u.txt"
    f2.write_text("A paragraph without a title line before it, longer than eight words.\n")
    paras = train_text.paragraphs(f)
    assert [t for t, _ in paras] == ["Iceland", "Iceland", "Iceland"]
    assert paras[1][1].startswith("Its economy")
    assert train_text.paragraphs(f2)[0][0] is None


def test_chunks_and_conversations(tiny_llama):
    tok = Tokenizer(tiny_llama)
    paras = train_text.paragraphs(train_text.resolve_text("calibration"))[:12]
    chunks = train_text.plain_chunks(tok, paras, 200)
    assert all(len(c) <= 200 for c in chunks) and len(chunks) > 1
    convs = train_text.chat_conversations(tok, paras, seed=0, max_tokens=100_000)
    assert len(convs) == len(paras)
    text = tok.decode(convs[0], skip_special_tokens=False)
    assert paras[0][1] in text and paras[0][0] in text.split(paras[0][1])[0]  # the topic is asked first


def test_the_bundled_text_is_disjoint_from_what_is_scored_and_benchmarked():
    from ridgeline.bench import corpus
    calibration = train_text.paragraphs(train_text.resolve_text("calibration"))
    heldout = (train_text.resolve_text("calibration").parent / "heldout.txt").read_text()
    assert len(calibration) > 200
    assert not any(p in heldout for _, p in calibration)
    bench = [p for _, p in corpus.PASSAGES] + corpus.QUESTIONS + corpus.TASKS + corpus.FOLLOW_UPS
    text = " ".join(p for _, p in calibration)
    assert not any(b.split("{")[0].strip() in text for b in bench if len(b.split("{")[0]) > 20)
    with pytest.raises(InvalidRequestError, match="heldout.txt is what"):
        train_text.resolve_text(str(train_text.resolve_text("calibration").parent / "heldout.txt"))


def test_document_tasks_paste_each_paragraph_and_are_no_benchmark_prompt(tiny_llama):
    """`tasks:FILE`: every paragraph pasted into every shipped task, and once per task as the
    assistant's first turn before a follow-up; the shipped task, system and follow-up texts are
    none of the benchmark workloads'."""
    from ridgeline.bench import corpus
    from ridgeline.speculative.train_data import _encode, _prompt_lines, doc_task_prompts
    paras = train_text.paragraphs(train_text.resolve_text("calibration"))[:3]
    convs = doc_task_prompts(paras, seed=4)
    tasks = [c for c in convs if c[-1]["role"] == "user" and len(c[-1]["content"]) > 200]
    follow = [c for c in convs if len(c) == 3 and c[1]["role"] == "assistant"]
    assert len(tasks) == len(follow) == len(convs) // 2 and len(convs) % (2 * len(paras)) == 0
    for _, text in paras:
        assert sum(text in c[-1]["content"] for c in tasks) == len(convs) // (2 * len(paras))
        assert sum(c[1]["content"] == text for c in follow) == len(convs) // (2 * len(paras))
    assert any(c[0]["role"] == "system" for c in tasks) and any(c[0]["role"] == "user" for c in tasks)
    assert doc_task_prompts(paras, seed=4) == convs and doc_task_prompts(paras, seed=5) != convs
    ours = [c[-1]["content"].replace(t, "{text}") for c in tasks for _, t in paras if t in c[-1]["content"]]
    ours += _prompt_lines("systems.txt") + _prompt_lines("follow_ups.txt")
    bench = corpus.TASKS + corpus.SYSTEM_PROMPTS + corpus.FOLLOW_UPS + corpus.QUESTIONS
    assert not set(ours) & set(bench)
    tok = Tokenizer(tiny_llama)
    assert tok.decode(_encode(tok, follow[0]), skip_special_tokens=False).count(follow[0][1]["content"]) == 1


def test_teacher_forced_hidden_states_are_the_prompts(tiny_llama):
    eng = start_engine(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    seqs = train_text.source_sequences(eng.tokenizer, "text:calibration", 0, 64)[:3]
    samples = list(train_text.teacher_forced(eng, seqs, 100, "t", progress=False))
    assert len(samples) == 2  # stops once 100 tokens are taken
    assert samples[0].tokens.tolist() == seqs[0] and samples[0].hidden.dtype == torch.bfloat16
    assert samples[1].hidden.device.type == "cpu"  # the head trains there, whatever the target's device
    assert torch.allclose(samples[1].hidden.float(), eng.prompt_hidden(seqs[1]).cpu(), atol=1e-2)


def test_train_draft_mixes_sources_and_reuses_cached_data(tiny_llama, tmp_path, monkeypatch):
    from ridgeline.cli import main
    args = ["train-draft", str(tiny_llama), "--out", str(tmp_path / "head"), "--data", "chat:calibration",
            "--data", "replies", "--tokens", "1200", "--seed", "1", "--epochs", "1", "--max-reply-tokens", "32",
            "--dtype", "float32", "--draft-vocab", "200", "--quiet", "--data-cache", str(tmp_path / "cache")]
    assert main(args) == 0
    first = json.loads((tmp_path / "head" / "config.json").read_text())["training"]
    assert "--data chat:calibration --data replies" in first["command"]
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 2

    def no_new_data(*a, **k):
        raise AssertionError("the cached data should have been read")
    from ridgeline.speculative import train_data
    monkeypatch.setattr(train_data, "self_distill", no_new_data)
    monkeypatch.setattr(train_text, "teacher_forced", no_new_data)
    assert main(args) == 0
    second = json.loads((tmp_path / "head" / "config.json").read_text())["training"]
    assert second["tokens"] == first["tokens"] and second["samples"] == first["samples"]


def test_bad_data_source_is_a_usage_error(tiny_llama, tmp_path, capsys):
    from ridgeline.cli import main
    with pytest.raises(SystemExit):
        main(["train-draft", str(tiny_llama), "--out", str(tmp_path), "--data", "poems"])
    assert "expected replies, tasks:FILE, text:FILE or chat:FILE" in capsys.readouterr().err


def test_replies_continue_where_an_earlier_run_stopped(tiny_llama):
    """Sample n is the reply to prompt n with its own seed, whatever the batching: a cached run that
    stopped after n samples is continued by start=n."""
    from ridgeline.speculative.train_data import self_distill
    eng = start_engine(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    whole = _first(self_distill(eng, 10**6, seed=2, max_tokens=12, batch=4, progress=False), 6)
    rest = _first(self_distill(eng, 10**6, seed=2, max_tokens=12, batch=3, progress=False, start=4), 2)
    assert [s.tokens.tolist() for s in rest] == [s.tokens.tolist() for s in whole[4:6]]


def _first(it, n):
    out = []
    for s in it:
        out.append(s)
        if len(out) == n:
            break
    return out


def test_the_calibration_text_resolves_to_the_shipped_file():
    from ridgeline.speculative.train_text import resolve_text
    path = resolve_text("calibration")
    assert path.is_file() and path.read_text(encoding="utf-8").strip()
