"""Damaged inputs end in one line and exit 2, never a traceback: a truncated model.safetensors, and a
profile's side file (trace, speedscope, py-spy, ops trace) given to `specview report`."""

import os
import subprocess
import sys

import pytest

import tiny
from helpers import run_cli


@pytest.fixture
def truncated_model(tmp_path):
    folder = tiny.save(tiny.make_model("llama", 16, 0), tiny.make_tokenizer(16), tmp_path / "model")
    weights = os.path.join(folder, "model.safetensors")
    return folder, weights


@pytest.mark.parametrize("keep", [4, 20, -100])  # no header length, a header cut short, tensors cut short
def test_truncated_safetensors_is_one_line_naming_the_file(capsys, truncated_model, keep):
    folder, weights = truncated_model
    size = os.path.getsize(weights)
    os.truncate(weights, keep if keep > 0 else size + keep)
    code, out, err = run_cli(capsys, "run", "--target", folder, "--draft", folder, "-N", "2")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("specview run: error: ")
    assert weights in err and "truncated" in err
    assert "Traceback" not in err


def test_truncated_safetensors_subprocess(truncated_model):
    folder, weights = truncated_model
    os.truncate(weights, os.path.getsize(weights) // 2)
    proc = subprocess.run([sys.executable, "-m", "specview", "run", "--target", folder, "--draft", folder,
                           "-N", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and weights in proc.stderr
    assert "Traceback" not in proc.stderr


SIDE_FILES = {  # suffix -> content, as the recorder writes them beside X.json
    ".trace.json": b'{"traceEvents": []}',
    ".ops.trace.json": b'{"traceEvents": [], "deviceProperties": []}',
    ".speedscope.json": b'{"$schema": "https://www.speedscope.app/file-format-schema.json", "profiles": []}',
    ".py-spy.speedscope.json": b'{"$schema": "https://www.speedscope.app/file-format-schema.json", "profiles": []}',
}


@pytest.mark.parametrize("suffix", sorted(SIDE_FILES))
def test_report_on_a_side_file_points_to_its_profile(capsys, tmp_path, suffix):
    stem = tmp_path / "run-20260101-120000"
    side = f"{stem}{suffix}"
    with open(side, "wb") as f:
        f.write(SIDE_FILES[suffix])
    code, out, err = run_cli(capsys, "report", side)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "run-20260101-120000.json, which is not there" in err
    assert ".py-spy.json" not in err and ".ops.json" not in err
    profile = f"{stem}.json"
    with open(profile, "w") as f:
        f.write("{}")
    code, out, err = run_cli(capsys, "report", side)
    assert code == 2 and f"`specview report {profile}`" in err
