"""Small fake serving engines on a loopback port, answering in the shapes llama-server and vLLM document
(llama-server: /props, /slots, /completion with `timings`, /metrics under `llamacpp:`; vLLM: /v1/models, /version,
/v1/completions with `usage`, /metrics under `vllm:`), plus servers that are not engines. Their draft counts are a
fixed function of the prompt, so a test knows every count a request must get. `template=True` is an instruct model
behind a chat template (llama-server's /props `chat_template`, vLLM's /tokenize of messages): it answers a raw
prompt with end-of-sequence at once (one token, an empty text) unless ignore_eos; `eos_after=M` ends every other
answer after M tokens unless ignore_eos. Real engines are tested in tests/remote/ behind `make engines`."""

from __future__ import annotations

import json
import socket
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def drafts_for(prompt: str, n: int) -> tuple[int, int, int, list[int]]:
    """(drafted, accepted, verification steps, accepted per position) of a prompt: a pure function of it."""
    steps = 1 + len(prompt) % 3
    drafted = 4 * steps
    accepted = min(drafted, len(prompt.split()) % (drafted + 1), n - 1)
    per_pos = [0, 0, 0, 0]
    left = accepted
    for i in range(4):
        per_pos[i] = min(steps, left)
        left -= per_pos[i]
    return drafted, accepted, steps, per_pos


class FakeEngine:
    """One fake server's state: its kind, its counters so far and the request bodies it got."""

    def __init__(self, kind: str, speculative: bool = True, metrics: bool = True, template: bool = False,
                 eos_after: int | None = None):
        self.kind, self.speculative, self.metrics = kind, speculative, metrics
        self.template, self.eos_after = template, eos_after
        self.requests: list[tuple[str, dict]] = []
        self.totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "generated": 0, "per_pos": [0, 0, 0, 0]}
        self.lock = threading.Lock()

    def exposition(self) -> str:
        t = self.totals
        if self.kind == "vllm":
            labels = 'engine="0",model_name="fake"'
            lines = ["# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                     "# TYPE vllm:generation_tokens_total counter",
                     f"vllm:generation_tokens_total{{{labels}}} {float(t['generated'])}"]
            if self.speculative:
                for name, key in (("num_drafts", "drafts"), ("num_draft_tokens", "draft_tokens"),
                                  ("num_accepted_tokens", "accepted")):
                    lines += [f"# TYPE vllm:spec_decode_{name}_total counter",
                              f"vllm:spec_decode_{name}_total{{{labels}}} {float(t[key])}",
                              f"vllm:spec_decode_{name}_created{{{labels}}} 1.7e9"]
                lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
                lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(v)}'
                          for i, v in enumerate(t["per_pos"])]
            return "\n".join(lines) + "\n"
        lines = [f"llamacpp:tokens_predicted_total {t['generated']}",
                 f"llamacpp:spec_decode_num_draft_tokens_total {t['draft_tokens']}",
                 f"llamacpp:spec_decode_num_accepted_tokens_total {t['accepted']}",
                 f"llamacpp:spec_decode_num_drafts_total {t['drafts']}"]
        lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                  for i, v in enumerate(t["per_pos"])]
        return "\n".join(lines) + "\n"

    def answer_length(self, n: int, body: dict, chat: bool) -> int:
        """How many tokens an answer gets: n, or fewer where the model ends it (see the module docstring)."""
        if body.get("ignore_eos"):
            return n
        if self.template and not chat:
            return min(n, 1)
        return min(n, self.eos_after) if self.eos_after is not None else n

    def generate(self, prompt: str, n: int, empty: bool = False) -> tuple[str, dict]:
        """The text (n words, a function of the prompt; none when `empty`) and llama-server's timings for it;
        counts added."""
        drafted, accepted, steps, per_pos = drafts_for(prompt, n) if self.speculative else (0, 0, 0, [0] * 4)
        with self.lock:
            t = self.totals
            t["drafts"] += steps
            t["draft_tokens"] += drafted
            t["accepted"] += accepted
            t["generated"] += n
            t["per_pos"] = [a + b for a, b in zip(t["per_pos"], per_pos)]
        timings = {"prompt_n": len(prompt.split()), "prompt_ms": 1.5, "predicted_n": n, "predicted_ms": 10.0 * n,
                   "predicted_per_second": 100.0}
        if drafted:  # llama-server leaves both out when nothing was drafted
            timings.update(draft_n=drafted, draft_n_accepted=accepted)
        return "" if empty else " ".join(f"w{(len(prompt) + i) % 7}" for i in range(n)), timings


def _handler(engine: FakeEngine):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet tests
            pass

        def _send(self, code: int, body, content_type: str = "application/json") -> None:
            data = (json.dumps(body) if content_type == "application/json" else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            kind, path = engine.kind, self.path
            if kind == "llama-server" and path == "/props":
                params = {"speculative.types": "none"}  # the per-request default, as the real one says
                return self._send(200, {"default_generation_settings": {"n_ctx": 4096, "params": params},
                                        "model_path": "/models/fake.gguf", "build_info": "b9999-fake",
                                        "chat_template": "{{ messages }}" if engine.template else ""})
            if kind == "llama-server" and path == "/slots":
                slot = {"id": 0, "speculative": engine.speculative}
                if engine.requests:  # once a slot has served a request it shows its params
                    slot["params"] = {"speculative.types": "none,ngram-simple" if engine.speculative else "none"}
                return self._send(200, [slot])
            if path == "/metrics" and kind in ("llama-server", "vllm") and engine.metrics:
                return self._send(200, engine.exposition(), "text/plain; version=0.0.4")
            if path == "/health":
                return self._send(200, {"status": "ok"})
            if path == "/v1/models" and kind in ("llama-server", "vllm", "openai"):
                return self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            if path == "/version" and kind == "vllm":
                return self._send(200, {"version": "0.0.0-fake"})
            if kind == "html":
                return self._send(200, "<html>a web page</html>", "text/html")
            return self._send(404, {"error": {"code": 404, "message": "File Not Found"}})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            engine.requests.append((self.path, body))
            kind = engine.kind
            if kind == "llama-server" and self.path == "/completion":
                prompt = body["prompt"] if isinstance(body["prompt"], str) else " ".join(map(str, body["prompt"]))
                n = engine.answer_length(body["n_predict"], body, False)
                text, timings = engine.generate(prompt, n, empty=n < body["n_predict"] and engine.template)
                out = {"content": text, "tokens_predicted": n, "timings": timings, "stop": True,
                       "stop_type": "limit" if n == body["n_predict"] else "eos"}
                if body.get("return_tokens"):
                    out["tokens"] = [(len(prompt) + i) % 7 for i in range(n)]
                return self._send(200, out)
            if kind == "vllm" and self.path == "/tokenize" and "messages" in body:
                if not engine.template:  # as vLLM answers a model without a chat template
                    return self._send(400, {"error": {"message": "no chat template", "code": 400}})
                return self._send(200, {"count": 3, "max_model_len": 8192, "tokens": [1, 2, 3]})
            chat = self.path == "/v1/chat/completions" and engine.template
            if kind in ("llama-server", "vllm", "openai") and (self.path == "/v1/completions" or chat):
                prompt = body["messages"][-1]["content"] if chat else body["prompt"]
                ids = None if isinstance(prompt, str) else prompt  # vLLM takes token ids too
                prompt = prompt if ids is None else " ".join(map(str, ids))
                n = engine.answer_length(body["max_tokens"], body, chat)
                text, timings = engine.generate(prompt, n, empty=n < body["max_tokens"] and engine.template
                                                and not chat)
                choice = {"index": 0, "finish_reason": "length" if n == body["max_tokens"] else "stop"}
                if body.get("return_token_ids"):
                    choice["token_ids"] = [(len(prompt) + i) % 7 for i in range(n)]
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                out = {"object": "chat.completion" if chat else "text_completion", "choices": [choice],
                       "usage": {"prompt_tokens": timings["prompt_n"], "completion_tokens": n}}
                if kind == "llama-server":
                    out["timings"] = timings
                return self._send(200, out)
            return self._send(404, {"error": {"code": 404, "message": "File Not Found"}})

    return Handler


@contextmanager
def fake_engine(kind: str, speculative: bool = True, metrics: bool = True, template: bool = False,
                eos_after: int | None = None):
    """A FakeEngine serving on 127.0.0.1 (a free port) -> (engine, url)."""
    engine = FakeEngine(kind, speculative, metrics, template, eos_after)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield engine, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def not_http_server():
    """A TCP port that answers every connection with bytes that are not HTTP."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve():
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_vllm(argv: list[str]) -> None:
    """A stand-in for `python -m vllm.entrypoints.openai.api_server` (`bench --peer vllm` without `make engines`):
    the fake's vLLM answers on --port. Like the real one, it first starts a child of its own (vLLM's EngineCore),
    which here ignores SIGTERM: only a stop of the whole process group ends it. Its pid goes to $FAKE_VLLM_PIDS
    (appended, one a line); $FAKE_VLLM_NEVER_READY keeps the server from ever listening (a start-up that does not
    end)."""
    import os
    import subprocess
    import time

    child = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                              "while True: time.sleep(1)"])
    if os.environ.get("FAKE_VLLM_PIDS"):
        with open(os.environ["FAKE_VLLM_PIDS"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n{child.pid}\n")
    if os.environ.get("FAKE_VLLM_NEVER_READY"):
        while True:
            print("Compiling a graph", flush=True)
            time.sleep(0.2)
    port = int(argv[argv.index("--port") + 1])
    engine = FakeEngine("vllm", speculative="--speculative-config" in argv)
    print(f"serving on {port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), _handler(engine)).serve_forever()


def main(argv: list[str]) -> None:
    """A stand-in for the llama-server binary (`bench --peer llama-server` without `make engines`): the flags
    specview passes, --version, and the fake's answers on --port until it is terminated. With `-m
    vllm.entrypoints.openai.api_server`, vLLM's (fake_vllm)."""
    if argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]:
        fake_vllm(argv[2:])
        return
    if "--version" in argv:
        print("version: 0 (fake)", file=sys.stderr)
        return
    port = int(argv[argv.index("--port") + 1])
    engine = FakeEngine("llama-server", speculative="--spec-type" in argv)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(engine))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
