"""Soak benchmark (not a pass/fail test): does RSS stay flat over a long `specview run`?

    HF_HUB_OFFLINE=1 python -m specview.tools.soak                  # 20,000 tokens, speculative, sampling
    python -m specview.tools.soak --tokens 5000 --profile           # also keep a profile (the recorder's records)

Builds a tiny random Llama pair with a long context (max_position_embeddings 32768) in a temp folder
(the draft is the target plus noise, so drafts are accepted some of the time but not always), then
runs `specview run` in a subprocess with --ignore-eos, -N TOKENS, temperature 1, --quiet and
--jsonl to a file. Every step event carries the process's RSS (psutil, measured right after the
step); this script reads them back and prints RSS every 1000 generated tokens and its growth after
the warm-up (the first 2000 tokens).

The KV caches grow with the context by design: their size at the end is printed too (the model is
kept small enough, 128 bytes a token per model, that they alone stay well under the 5% target), so
growth beyond it is what a leak would look like.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 2000
EVERY = 1000
# The tiny model: 2 layers, 4 query heads of 8 dims, 1 KV head -> K and V: 2 * 2 * 1 * 8 * 4 bytes = 128 B a token.
LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB, CONTEXT = 2, 32, 4, 1, 64, 32768


def build_pair(folder: str, seed: int = 0) -> tuple[str, str]:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CONTEXT,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaked distributions, far from uniform
    draft = LlamaForCausalLM(cfg).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.3 * (p.std() if p.numel() > 1 else 1.0))
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = os.path.join(folder, name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


def kv_mb(tokens: int) -> float:
    head_dim = HIDDEN // HEADS
    return 2 * LAYERS * KV_HEADS * head_dim * 4 * tokens / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20000, help="tokens to generate (default 20000)")
    ap.add_argument("-K", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="also record a profile (keeps every step record)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep the models and the event file")
    args = ap.parse_args(argv)
    if args.tokens + 10 > CONTEXT:
        ap.error(f"--tokens must leave room in the context of {CONTEXT}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.keep or tempfile.mkdtemp(prefix="specview-soak-")
    os.makedirs(work, exist_ok=True)
    target, draft = build_pair(work)
    events = os.path.join(work, "events.jsonl")
    cmd = [sys.executable, "-m", "specview.cli.main", "run", "--target", target, "--draft", draft, "--prompt", "w1 w2 w3",
           "-N", str(args.tokens), "-K", str(args.K), "--temperature", "1", "--ignore-eos", "--quiet",
           "--threads", str(args.threads), "--jsonl", events]
    if args.profile:
        cmd += ["--profile", "--profile-dir", os.path.join(work, "profiles")]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print("running:", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode

    samples = []  # (tokens generated, rss MiB, step) at each EVERY-token mark, and the last step
    generated, mark, steps = 0, 0, 0
    with open(events, encoding="utf-8") as f:
        for line in f:
            ev = json.loads(line)
            if ev["type"] == "end":
                summary = ev
            if ev["type"] != "step":
                continue
            steps += 1
            generated += len(ev["emitted"])
            rss = ev["memory_mb"]["rss"]
            if generated >= mark:
                samples.append((generated, rss, steps))
                mark = (generated // EVERY + 1) * EVERY
    if samples[-1][0] != generated:
        samples.append((generated, rss, steps))

    print(f"\n{generated} tokens in {steps} steps, {wall:.0f} s (acceptance {summary['acceptance_rate']:.1%}, "
          f"{summary['tokens_per_s']:.0f} tokens/s)")
    print(f"{'tokens':>7} {'steps':>6} {'RSS MiB':>8} {'KV MiB':>7}")
    for tokens, rss, step in samples:
        print(f"{tokens:7d} {step:6d} {rss:8.1f} {kv_mb(tokens + 3) * 2:7.2f}")
    base = next(rss for tokens, rss, _ in samples if tokens >= WARMUP)
    last = samples[-1][1]
    peak = max(rss for tokens, rss, _ in samples if tokens >= WARMUP)
    kv_growth = (kv_mb(generated) - kv_mb(WARMUP)) * 2  # target + draft
    print(f"\nRSS after warm-up ({WARMUP} tokens): {base:.1f} MiB; at the end: {last:.1f} MiB; peak {peak:.1f} MiB")
    print(f"growth after warm-up: {last - base:+.1f} MiB ({(last - base) / base:+.2%}); "
          f"of which the KV caches' expected growth: {kv_growth:.1f} MiB; "
          f"unexplained: {last - base - kv_growth:+.1f} MiB ({(last - base - kv_growth) / base:+.2%})")
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
