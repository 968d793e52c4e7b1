"""SIGTERM to a real `specview serve` process in the middle of a request: the step in flight finishes, that
request's stream ends with an `interrupted` end record, the request waiting behind it gets 503, the
session's profile is written, and the process exits 0 with no traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import TIMEOUT, wait_for

import tiny
from specview.serve.client import iter_sse


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_request_finishes_the_step_answers_the_queue_and_saves(tiny_dir, tmp_path, sig):
    path = tiny.save(tiny.make_model("gpt2", 16, 0, n_positions=8192), tiny.make_tokenizer(16), tiny_dir / "serve-long")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specview", "serve", "--target", path, "--draft", path, "--port", "0",
         "--threads", "1", "--profile-dir", str(tmp_path / "prof"), "--max-new-tokens-cap", "8000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a background job: must not matter
    )
    try:
        said = []
        for line in proc.stderr:  # the loading lines, then the one that says where it listens
            said.append(line)
            if match := re.search(r" on (http://\S+) ", line):
                url = match.group(1)
                break
        else:
            raise AssertionError(f"the server never said where it listens (exit {proc.wait()}): {''.join(said)}")
        body = {"prompt": "w1 w2", "max_new_tokens": 8000, "k": 2, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client, ThreadPoolExecutor(1) as pool:
            with client.stream("POST", "/generate", json=body) as response:
                records = iter_sse(response.iter_lines())
                seen = [next(records)[1] for _ in range(4)]  # start + 3 steps: the run is under way
                waiting = pool.submit(client.post, "/generate", json={"prompt": "w3", "max_new_tokens": 4})
                wait_for(lambda health: health["queue"] == 1, "the second request to wait", client)
                proc.send_signal(sig)
                seen += [record for _, record in records]
            queued = waiting.result(TIMEOUT)
        rest, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r["type"] for r in seen[:4]] == ["start", "step", "step", "step"]
    end = seen[-1]
    assert end["type"] == "end" and end["stop_reason"] == "interrupted" and 3 <= end["steps"] < 4000
    assert [r["type"] for r in seen].count("step") == end["steps"]  # every step it ran reached the client
    assert queued.status_code == 503 and "shutting down" in queued.json()["error"]
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "finishing the step in flight" in err
    [profile] = [p for p in (tmp_path / "prof").glob("*.json") if p.name.count(".") == 1]
    doc = json.loads(profile.read_text())
    assert doc["summary"]["interrupted"] is True and doc["summary"]["steps"] == end["steps"]
    assert f"profile written: {profile}" in err

