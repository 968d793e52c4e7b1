"""`make gpu-smoke` on a machine without a GPU: one line and exit 2; its steps listed for a device (no GPU ran them)."""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("gpu_smoke", os.path.join(HERE, "gpu_smoke.py"))
gpu_smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_smoke)


def test_no_gpu_refuses_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(gpu_smoke, "find_gpu", lambda: None)
    assert gpu_smoke.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "no GPU here" in err


def test_the_steps_cover_every_command(capsys):
    assert gpu_smoke.main(["--list", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    for needed in ("@int4", "ngram", "self:skip", ";tree:", "check", "--profile-ops", "report", "engine stream",
                   "--peer hf", "calibrate", "--device-map auto", "probe"):
        assert needed in out, needed
    assert all("--device cuda" in line for line in out.splitlines() if " -m specview run" in line)
