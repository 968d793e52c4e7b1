"""`specview bench --peer llama-server[:TYPE]`: the peer's command line, and a whole bench against a stand-in for
the binary (tests/support/fake_engines.py run as a program: the flags specview passes, llama-server's answers).
The real server: tests/remote/test_llama_server.py, behind `make engines`."""

import argparse
import json
import os
import stat
import sys
from types import SimpleNamespace

import pytest

from helpers import run_cli
from specview.bench.options import parse_peer
from tiny import write_tiny_gguf

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def test_peer_names_and_types():
    assert parse_peer("llama-server") == "llama-server"
    assert parse_peer("hf, llama-server:ngram-mod") == "hf,llama-server:ngram-mod"
    for bad in ("llama-server:eagle", "hf:ngram-simple", "llama-server:ngram-mod,llama-server"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_peer(bad)


@pytest.fixture
def fake_binary(tmp_path, monkeypatch):
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {os.path.join(SUPPORT, 'fake_engines.py')} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SPECVIEW_LLAMA_SERVER", str(script))
    return str(script)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_bench_times_llama_server_beside_ours_in_one_run(capsys, tmp_path, fake_binary, tiny_gguf):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(capsys, "bench", "--target", tiny_gguf, "--prompt", "w1 w2 w3",
                                "--peer", "llama-server:ngram-simple", "--draft", "ngram",
                                "--temperature", "0", "-N", "8", "-K", "3", "-R", "2", "--threads", "1",
                                "--no-profile", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    m = doc["methods"]
    assert {"autoregressive", "speculative", "llama_server_generate", "llama_server_speculative"} <= set(m)
    spec = m["llama_server_speculative"]
    runs = spec["runs"]
    assert len(runs) == 2 and all(r["tokens"] == 8 for r in runs)  # exactly N, every round
    drafted = sum(r["engine"]["timings"]["draft_n"] for r in runs)
    accepted = sum(r["engine"]["timings"]["draft_n_accepted"] for r in runs)
    assert (spec["drafted"], spec["accepted"]) == (drafted, accepted)
    assert spec["acceptance_rate"] == accepted / drafted
    assert spec["mean_emitted_per_step"] == 16 / (16 - accepted)
    peer = spec["peer"]
    assert peer["implementation"] == "llama-server" and peer["version"] == "version: 0 (fake)"
    assert peer["spec_type"] == "ngram-simple" and peer["n_threads"] == 1 and peer["gguf"] == tiny_gguf
    flags = peer["flags"]
    assert flags[flags.index("--spec-type") + 1] == "ngram-simple" and flags[flags.index("--spec-draft-n-max") + 1] == "3"
    assert flags[flags.index("-t") + 1] == "1" and flags[flags.index("--spec-ngram-simple-size-m") + 1] == "3"
    assert "--spec-type" not in m["llama_server_generate"]["peer"]["flags"]
    assert "speculative_over_llama_server_speculative" in doc["peer_ratios"]
    flat = " ".join(stdout.split())
    assert "llama-server ngram-simple: acceptance" in flat and "tokens per step" in flat


def test_without_the_binary_the_peer_is_skipped_with_its_reason(tmp_path, monkeypatch):
    from specview.bench.llama_server import llama_server_methods
    from specview.core.settings import Settings

    monkeypatch.setenv("SPECVIEW_LLAMA_SERVER", str(tmp_path / "missing"))
    skipped: dict = {}
    session = SimpleNamespace(settings=Settings(), prompt_ids=[1, 2, 3])
    assert llama_server_methods(session, None, "llama-server", skipped) == {}
    assert skipped == {"llama-server": "llama-server is not built (make engines, or "
                                       "SPECVIEW_LLAMA_SERVER=/path/to/llama-server)"}
