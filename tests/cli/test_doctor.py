"""`specview doctor`: every choice kept for this machine with its load and age; provisional ones said; --retake takes
them again (issue "neighbours" §1)."""

import json

import pytest

from specview.cli.main import main
from specview.core import host, load
from specview.cpu.matmul import packed_linear

QUIET = {"cores": 2, "threads": 1, "others_cores": 0.0, "steal_cores": 0.0, "quiet": True}
BUSY = {"cores": 2, "threads": 2, "others_cores": 1.0, "steal_cores": 0.0, "quiet": False}


def seed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    me = host.host_key()
    host.store_cached("kernels.json", {
        f"{me}/torch x/threads=2/forward/aot/llama h576/float32": {
            "mode": "eager", "why": "probe", "load": BUSY, "measured_at": "2020-01-01T00:00:00+0000"},
        f"{me}/torch x/threads=1/forward/aot/llama h576/float32": {
            "mode": "compiled", "why": "probe", "load": QUIET, "measured_at": "2020-01-01T00:00:00+0000"},
        "another host/cpu/avx2/torch x/threads=2/forward": {"mode": "eager"}})
    host.store_cached("packed_linear.json", {f"{me}/torch x/torch.float32/576x576/threads=1": {
        "stock_one_s": 1.0, "stock_rows_s": 1.0, "kernel": "thin", "kernel_for_rows": "mlas"}})


def test_doctor_lists_each_kept_choice_with_its_load_and_age(tmp_path, monkeypatch, capsys):
    seed(tmp_path, monkeypatch)
    assert main(["doctor", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_key = {row["key"].split("/")[1] + " " + row["file"]: row for row in rows}
    assert len(rows) == 3  # the other host's is not this machine's
    eager = by_key["threads=2 kernels.json"]
    assert eager["verdict"] == "eager" and eager["provisional"] and eager["load"] == BUSY
    assert "under load: others busy 1.0 of 2 cores" in eager["load_said"] and eager["age_s"] > 86400
    assert not by_key["threads=1 kernels.json"]["provisional"]
    old = by_key["torch.float32 packed_linear.json"]
    assert old["verdict"] == "thin (rows: mlas)" and old["provisional"] and old["load_said"] == "load not recorded"
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "2 provisional" in out and "1 kept for other machines" in out and "under load" in out


def test_doctor_with_nothing_kept_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    assert main(["doctor"]) == 0
    assert "nothing kept yet" in capsys.readouterr().out


def test_retake_takes_even_a_quiet_verdict_again(tmp_path, monkeypatch):
    """What --retake sets while its session loads the pair: every kept verdict it reaches is measured again (and
    with the machine busy, the new one does not replace the quiet one)."""
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    host.store_cached(packed_linear.CHOICE_FILE, {"k": {"stock_one_s": 5.0, "stock_rows_s": 6.0, "load": QUIET}})
    figures = {"stock_one": 1.0, "stock_rows": 2.0}
    kept = {"stock_one": 5.0, "stock_rows": 6.0}

    def probe():
        return packed_linear.kept_probe("k", ("stock",), lambda: figures, lambda s: {"kernel": "stock"})

    assert probe() == kept
    monkeypatch.setattr(load, "retake_all", True)
    monkeypatch.setenv("SPECVIEW_LOAD", "busy")
    assert probe() == figures and host.read_cached(packed_linear.CHOICE_FILE)["k"]["stock_one_s"] == 5.0
    monkeypatch.setenv("SPECVIEW_LOAD", "quiet")
    assert probe() == figures and host.read_cached(packed_linear.CHOICE_FILE)["k"]["stock_one_s"] == 1.0


def test_doctor_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--threads", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--threads must be >= 1" in err
