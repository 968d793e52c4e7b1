"""A llama.cpp build that dies decoding on this machine (SIGILL from AMX in a VM, seen on a Xeon) is found by a
trial in a process of its own, said in one line, and kept per machine and build: the bench peer is skipped and
the drafter refuses, instead of the whole process dying. Needs no llama-cpp-python: the trial is replaced."""

import os
import signal

import pytest

from specview.drafters import llamacpp as drafter


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_trial_that_dies_of_a_signal_names_it_and_the_rebuild(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(drafter, "TRIAL", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    why = drafter.crash_reason(str(gguf))
    assert why.startswith("llama.cpp died of SIGILL in a trial decode") and "GGML_NATIVE=OFF" in why
    # kept: a second call runs no trial (one that would pass now is not consulted)
    monkeypatch.setattr(drafter, "TRIAL", "pass")
    assert drafter.crash_reason(str(gguf)) == why
    assert (cache / drafter.TRIAL_FILE).exists()


def test_a_trial_that_decodes_or_fails_in_python_is_no_crash(cache, monkeypatch, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(drafter, "TRIAL", "pass")
    assert drafter.crash_reason(str(gguf)) is None
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    monkeypatch.setattr(drafter, "TRIAL", "raise ValueError('cannot load')")  # said when loaded for real
    assert drafter.crash_reason(str(other)) is None


def test_the_bench_peer_is_skipped_with_that_line(cache, monkeypatch):
    pytest.importorskip("llama_cpp")
    from specview.bench import llamacpp as peer

    monkeypatch.setattr(drafter, "TRIAL", f"import os; os.kill(os.getpid(), {int(signal.SIGILL)})")
    assert peer.unavailable("smollm2-135m").startswith("llama.cpp died of SIGILL")
    assert os.path.exists(cache / drafter.TRIAL_FILE)
