"""The command line as a new user meets it: help for every flag with its default, --version, pipes."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ridgeline
from ridgeline.cli import EXIT_BROKEN_PIPE, build_parser, main
from ridgeline.cli_parser import shows_default

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {("generate",), ("chat",), ("pull",), ("serve",), ("cache-report",), ("bench", "throughput"),
            ("bench", "decode"), ("bench", "serve"), ("advise",), ("advise", "kv"), ("advise", "gpus"),
            ("advise", "spec"), ("advise", "disagg"), ("eval",), ("quantize",)}
SECRET = "sk-not-for-help-text"


def parsers(parser: argparse.ArgumentParser, path: tuple = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def options(parser: argparse.ArgumentParser):
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


@pytest.fixture
def parser(monkeypatch):
    monkeypatch.setenv("RIDGELINE_API_KEY", SECRET)  # read as a default at build time: never shown
    return build_parser()


def test_every_command_is_walked(parser):
    assert COMMANDS <= {path for path, _ in parsers(parser)}


def test_every_option_has_help_that_shows_its_default(parser):
    missing = []
    for path, p in parsers(parser):
        formatter = p._get_formatter()
        for a in options(p):
            name = " ".join(["ridgeline", *path, a.option_strings[0] if a.option_strings else a.dest])
            text = formatter._expand_help(a) if a.help else ""
            if not text.strip():
                missing.append(f"{name}: no help")
            elif a.nargs != 0 and (a.option_strings or a.nargs in ("?", "*")) and "default" not in text.lower():
                missing.append(f"{name}: help does not say the default ({a.default!r}): {text!r}")
            elif shows_default(a) and "default" not in (a.help or "").lower():
                assert text.endswith(f"(default: {a.default})"), name
        full = p.format_help(full=True)  # what --help-all prints
        for a in options(p):
            if a.option_strings and a.option_strings[-1] not in full:
                missing.append(f"ridgeline {' '.join(path)} {a.option_strings[-1]}: not in --help-all")
        assert SECRET not in full and SECRET not in p.format_help(), path
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("command, hidden, shown", [
    (["serve"], "--max-logprob-entries", "--api-key"),
    (["generate"], "--kv-eviction-budget", "--max-tokens"),
    (["bench", "serve"], "--workload-seed", "--concurrency"),
])
def test_help_is_short_and_help_all_is_whole(capsys, command, hidden, shown):
    outputs = {}
    for flag in ("--help", "--help-all"):
        with pytest.raises(SystemExit) as e:
            main([*command, flag])
        assert e.value.code == 0
        outputs[flag] = capsys.readouterr().out
    brief, full = outputs["--help"], outputs["--help-all"]
    assert shown in brief and shown in full
    assert hidden not in brief and hidden in full
    assert f"`ridgeline {' '.join(command)} --help-all` lists every one" in brief
    assert len(brief.splitlines()) < len(full.splitlines()) / 2 or len(brief.splitlines()) <= 120


def test_a_bad_flag_shows_the_short_usage(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--port", "many"])
    err = capsys.readouterr().err
    assert "--port" in err and "--kv-transfer-timeout" not in err  # usage lists the common flags only


@pytest.mark.parametrize("argv, expect", [
    (["generate", "--help"], "(default: 256)"),  # --max-tokens
    (["serve", "--help"], "(default: 8000)"),  # registered from its own module, same class
    (["bench", "decode", "--help"], "(default: 128)"),  # a RawDescriptionHelpFormatter keeps the defaults
    (["advise", "kv", "--help"], "(default: 16)"),  # a subcommand whose own default is suppressed
    (["pull", "--help"], "(default: smollm2-135m)"),  # an optional positional
])
def test_help_output_shows_defaults(capsys, argv, expect):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert expect in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"ridgeline {ridgeline.__version__}"


def test_bad_flag_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", "--max-tokens", "many"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ridgeline generate")
    assert err.strip().splitlines()[-1] == "ridgeline generate: error: argument --max-tokens: invalid int value: 'many'"


@pytest.mark.parametrize("argv, message", [
    (["bench", "decode", "--repeats", "0"], "argument --repeats: expected a positive integer, got '0'"),
    (["bench", "decode", "--output-len", "-1"], "argument --output-len: expected a positive integer, got '-1'"),
    (["bench", "throughput", "--num-requests", "0"], "argument --num-requests: expected a positive integer"),
    (["bench", "throughput", "--hf-batch", "-1"], "argument --hf-batch: expected an integer >= 0, got '-1'"),
    (["bench", "throughput", "--json", "/nonexistent-dir/t.json"], "folder /nonexistent-dir does not exist"),
    (["bench", "serve", "--request-rate", "nan"], "argument --request-rate: expected a positive number or inf"),
    (["bench", "serve", "--concurrency", "0"], "argument --concurrency: expected a positive integer"),
    (["advise", "--plot", "/nonexistent-dir/r.png"], "argument --plot: folder /nonexistent-dir does not exist"),
    (["cache-report", "log.jsonl", "--json", "/nonexistent-dir/r.json"], "folder /nonexistent-dir does not exist"),
])
def test_bad_flag_values_fail_before_anything_loads(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["bench", "throughput", "--min-prompt", "300", "--max-prompt", "100"], "--min-prompt 300 is over --max-prompt"),
    (["bench", "serve", "--min-prompt", "300", "--max-prompt", "100"], "--min-prompt 300 is over --max-prompt"),
    (["bench", "decode", "--prompt-len", "3", "--baseline", "none"], "cannot hold the chat template"),
])
def test_impossible_workloads_are_one_error_line(tiny_llama, capsys, argv, message):
    assert main([*argv, "--model", str(tiny_llama), "--kv-cache-memory", "16MiB"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: ") and message in err and "Traceback" not in err


# The reader closes the pipe before the command writes a byte: the child waits for stdin's EOF, which the
# test sends only after closing its end of stdout, so the write always meets a closed pipe.
WAIT_THEN_RUN = "import sys; sys.stdin.read(); from ridgeline.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("argv, rc", [
    (["advise", "--model", "Llama-3.1-70B", "--hardware", "H100"], EXIT_BROKEN_PIPE),
    (["--help"], 0),  # argparse drops help text the reader no longer wants and exits 0
])
def test_closed_pipe_ends_quietly(argv, rc):
    proc = subprocess.Popen([sys.executable, "-c", WAIT_THEN_RUN, *argv], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    proc.stdout.close()  # the reader is gone (`| head` after it read enough)
    proc.stdin.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == rc  # the timeout is a safety net only
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("device, message", [("tpu", "unknown device 'tpu'"), ("cuda:x", "unknown device"),
                                             ("cuda", "torch sees no CUDA device")])
def test_bad_device_is_one_error_line(tiny_llama, capsys, device, message):
    import torch
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["generate", "hi", "--model", str(tiny_llama), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
