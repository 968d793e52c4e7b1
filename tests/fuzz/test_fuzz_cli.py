"""A handful of the fuzzers' findings through a real `specview` process, as a user meets them: one line on
stderr, exit 2, no traceback, and the file it read left as it was. (The property tests call the parsers in
process, thousands of times; these check that the command line reaches the same checks.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONIOENCODING="utf-8")


def specview(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specview", *argv], capture_output=True, env=ENV, cwd=cwd,
                          timeout=180)


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, (proc.returncode, err[-800:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-800:]
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def tiny_target(gpt2_paths):
    return gpt2_paths[0]


def test_a_prompt_of_bytes_that_are_not_utf8(tiny_target):
    # argv bytes that are not UTF-8 reach Python as lone surrogates: the tokenizer raised a TypeError
    proc = specview(b"run", b"--target", tiny_target.encode(), b"--draft", b"ngram", b"--prompt", b"\xff w1",
                    b"-N", b"2", b"-q")
    assert_one_line(proc, "--prompt is not text", "0xFF")


def test_a_skip_range_past_the_model(tiny_target):
    # was a hang: a set of 10**12 layers (--max-memory and the rest: test_fuzz_parsers.py, in process)
    assert_one_line(specview("run", "--target", tiny_target, "-N", "2", "-q", "--draft", "self:skip=0-999999999999"),
                    "out of range")


def test_a_device_map_naming_a_device_torch_refuses(tiny_target, tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"": "gpu7"}))
    assert_one_line(specview("run", "--target", tiny_target, "--draft", "ngram", "--device-map", str(path), "-q"),
                    "is not a device")


def test_report_and_resume_of_damaged_files_leave_them_as_they_were(tmp_path):
    profile = tmp_path / "bench.json"
    data = json.dumps({"schema": "specview.bench/1", "sweep": [{}]}).encode()  # was a KeyError traceback
    profile.write_bytes(data)
    assert_one_line(specview("report", str(profile)), "damaged specview.bench/1 file", "KeyError")
    prompts = tmp_path / "set.jsonl"
    prompts.write_text('{"prompt": "w1 \\ud800"}\n')  # a broken escape: was a TypeError mid-eval, after the load
    assert_one_line(specview("eval", "--prompts", str(prompts)), "line 1", "not text")
    resume = tmp_path / "eval.json"
    resume.write_bytes(b'{"schema": "specview.eval/1", "config": {}, "prompts": [], "results": [], "summary": {')
    assert_one_line(specview("eval", "--resume", str(resume)), "truncated")
    assert resume.read_bytes().endswith(b'"summary": {') and profile.read_bytes() == data
