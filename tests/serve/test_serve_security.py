"""`specview serve` refuses what it must: a wrong token (401), a body too large (413), a malformed one
(422, the field named), a drafter it did not load (400), and none of them leaves it in a bad state: the
next good request gets the answer it gets alone. Also: beyond loopback only with a token."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from serve_helpers import TIMEOUT, running_server, stream_records

from helpers import run_cli
from specview.core.settings import Settings

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD = {"prompt": "w1 w2", "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def server(gpt2_paths, tmp_path):
    settings = Settings(target=gpt2_paths[0], draft=gpt2_paths[1], max_new_tokens=8, k=3, threads=1,
                        profile_dir=str(tmp_path / "profiles"))
    with running_server(settings, token=TOKEN, cap=32, max_body=1024) as served:
        with httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
            yield client


BAD_BODIES = [
    ({"max_new_tokens": 4}, "prompt", "Field required"),
    ({"prompt": 7}, "prompt", "valid string"),
    ({"prompt": "w1", "k": 0}, "k", "greater than or equal to 1"),
    ({"prompt": "w1", "k": "4"}, "k", "valid integer"),
    ({"prompt": "w1", "temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"prompt": "w1", "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": "w1", "method": "magic"}, "method", "'speculative' or 'autoregressive'"),
    ({"prompt": "w1", "max_new_tokens": 33}, "max_new_tokens", "at most 32"),
    ({"prompt": "w1", "max_new_tokens": 30, "target": "gpt2-xl"}, "target", "Extra inputs"),  # no model by name
    ({"prompt": "w1", "model": "/etc/passwd"}, "model", "Extra inputs"),  # nor a path
    ({"prompt": "w1 " * 100, "max_new_tokens": 30}, "max_new_tokens", "past the context"),
    ({"prompt": "w1", "chat": True}, "chat", "no chat template"),
]


def test_every_bad_request_is_refused_and_the_next_good_one_is_answered(server):
    alone = server.post("/generate", json=GOOD, headers=AUTH).json()["generated_ids"]
    assert len(alone) == 6
    checks = []
    for path in ("/generate", "/metrics", "/events", "/predict"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = server.request("POST" if path in ("/generate", "/predict") else "GET", path, json=GOOD, headers=headers)
            checks.append((path, r.status_code, r.json()["error"]))
    assert all(code == 401 and "token" in error for _, code, error in checks), checks
    assert server.get("/health").status_code == 200  # no token needed to ask if it is up

    big = {"prompt": "w1 " * 400}
    r = server.post("/generate", json=big, headers=AUTH)
    assert r.status_code == 413 and "larger than 1024 bytes" in r.json()["error"]
    chunks = (b'{"prompt": "' + b"w1 " * 100 for _ in range(5))  # chunked: no Content-Length to trust
    r = server.post("/generate", content=chunks, headers=AUTH)
    assert r.status_code == 413

    for body, field, message in BAD_BODIES:
        r = server.post("/generate", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == field and message in r.json()["error"], (body, r.json())
    r = server.post("/generate", content=b"{not json", headers=AUTH)
    assert r.status_code == 422 and "not JSON" in r.json()["error"]
    r = server.post("/generate", json=["w1"], headers=AUTH)
    assert r.status_code == 422 and "JSON object" in r.json()["error"]
    r = server.post("/generate", json={"prompt": "w1", "draft": "gpt2"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["field"] == "draft" and "not loaded" in r.json()["error"]

    assert server.post("/generate", json=GOOD, headers=AUTH).json()["generated_ids"] == alone
    streamed = stream_records(server, "/generate", {**GOOD, "stream": True}, headers=AUTH)
    assert streamed[-1]["generated_ids"] == alone
    seed = server.post("/predict", json={"prompt": "w1 w2"}, headers=AUTH).json()
    assert seed["text"].startswith("w1 w2") and seed["summary"]["type"] == "end"
    page = server.get("/metrics", headers=AUTH).text
    assert 'specview:requests_rejected_total{status="401"} 12.0' in page
    assert 'specview:requests_rejected_total{status="422"} 14.0' in page


def test_listening_beyond_loopback_needs_a_token(capsys):
    code, out, err = run_cli(capsys, "serve", "--host", "0.0.0.0")
    assert code == 2 and "give --token" in err and len(err.strip().splitlines()) == 1


def test_serve_help_and_usage_errors_load_no_torch():
    code = ("import sys, contextlib, io\nfrom specview.cli.main import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['serve', '--help'])\n"
            "with contextlib.redirect_stderr(io.StringIO()):\n"
            "    assert main(['serve', '--host', '10.1.2.3']) == 2\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
