"""`specview bench`'s command line (no torch here: `specview bench --help` is instant)."""

from __future__ import annotations

import argparse

from specview.bench.schema import PEERS, TYPED_PEERS, peer_base
from specview.core.options import Parser, add_run_options, allow_policy_list, number_type
from specview.core.settings import BENCH_DRAFTS, DEFAULT_DRAFT

# Equal token counts for every method, and both bundled drafts (the default one and the fastest) timed side by
# side; other defaults as `run` (DESIGN).
BENCH_DEFAULTS = {"ignore_eos": True, "draft": BENCH_DRAFTS}


def parse_sweep(text: str) -> list[int]:
    """'1,2,3,4,6,8' -> [1, 2, 3, 4, 6, 8]; anything else is a one-line usage error."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"--sweep-k needs a comma-separated list of K >= 1 like 1,2,4,8, got {text!r}")
    try:
        ks = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep-k needs integers like 1,2,4,8, got {text!r}") from None
    if any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"--sweep-k values must be >= 1, got {text!r}")
    return sorted(set(ks))


def parse_peer(text: str) -> str:
    """'hf', 'llamacpp' or a comma-separated list of them -> the same list cleaned ('llamacpp,hf'); kept a
    string, so the bench file's config.peer stays what it was for `--peer hf`."""
    names = [p.strip() for p in text.split(",")]
    if any(peer_base(n) not in PEERS or (":" in n and peer_base(n) not in TYPED_PEERS) for n in names):
        raise argparse.ArgumentTypeError(f"--peer takes {', '.join(PEERS)} (llama-server:TYPE, vllm:METHOD for their "
                                         f"speculation), or a comma-separated list of them like hf,llamacpp; got "
                                         f"{text!r}")
    for n in names:
        if ":" in n and peer_base(n) == "llama-server":
            from specview.remote.llama_server import SPEC_TYPES

            if n.partition(":")[2] not in SPEC_TYPES:
                raise argparse.ArgumentTypeError(f"--peer {n}: llama-server's speculative types here are "
                                                 f"{', '.join(SPEC_TYPES)}")
        if ":" in n and peer_base(n) == "vllm":
            from specview.remote.vllm_server import SPEC_METHODS

            if n.partition(":")[2] not in SPEC_METHODS:
                raise argparse.ArgumentTypeError(f"--peer {n}: vLLM's speculative methods here are "
                                                 f"{', '.join(SPEC_METHODS)}")
    for typed in TYPED_PEERS:
        if sum(peer_base(n) == typed for n in names) > 1:
            raise argparse.ArgumentTypeError(f"--peer: one {typed} at a time ({typed}:TYPE)")
    return ",".join(dict.fromkeys(names))


def build_bench_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="specview bench",
        description="Time autoregressive, speculative and draft-only decoding (and with --peer hf, "
                    "transformers' generate() and assisted generation; with --peer llamacpp, llama.cpp on the "
                    "same GGUF) side by side on the same prompt.",
        epilog="Bench differs from `run` in one default: --ignore-eos, so every method emits the same number of "
               "tokens. With --temperature 0 every target-distribution method must emit the same tokens, and the "
               "table checks it. `make bench` runs --peer hf --temperature 0 -N 48.\n"
               "The metrics (c, v, ideal / theoretical speedup, efficiency) follow docs/design/metrics.md; see README.",
    )
    add_run_options(p)
    allow_policy_list(p, "bench")
    p.set_defaults(**BENCH_DEFAULTS)
    for action in p._actions:  # show the bench defaults in --help
        if action.dest == "ignore_eos":
            action.help = "keep going past the end-of-sequence token (bench default: on)"
        elif action.dest == "draft":
            action.help = action.help.replace(f"(default {DEFAULT_DRAFT})", f"(bench default {BENCH_DRAFTS})")
    g = p.add_argument_group("bench")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="stop at EOS (methods may then emit different numbers of tokens)")
    g.add_argument("--num-runs", "-R", type=number_type(int, "--num-runs", lambda v: v >= 1, ">= 1"), default=5, help="timed rounds after the warm-up (default 5)")
    g.add_argument("--peer", type=parse_peer, default=None,
                   metavar="{hf,llamacpp,llama-server[:TYPE],vllm[:METHOD]}[,..]",
                   help="also time peer implementations: hf = transformers generate(), assisted generation (beside "
                        "the draft model) and prompt lookup (beside ngram); llamacpp = llama-cpp-python on the "
                        "target's GGUF file, plain and with its prompt lookup (beside ngram; optional extra: "
                        "pip install -e \".[llamacpp]\"); llama-server[:TYPE] = llama.cpp's "
                        "server on that file, plain and with its speculative TYPE (default ngram-simple; draft-simple "
                        "drafts with the same file), K drafts at most (optional extra: make engines); vllm[:METHOD] = vLLM's "
                        "server on the target's folder, plain and with METHOD (ngram, the default; eagle3, the "
                        "EAGLE-3 head among --draft; draft, the draft model), K drafts per step, acceptance from its "
                        "counters (optional extra: make engines; minutes of start-up, not timed); a list like "
                        "hf,llamacpp times both")
    g.add_argument("--sweep-k", type=parse_sweep, default=None, metavar="K,K,..",
                   help="measure speculative decoding at each K (e.g. 1,2,3,4,6,8) and recommend one")
    g.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON (specview.bench/1)")
    g.add_argument("--no-profile", action="store_true", help="do not write the bench file to --profile-dir")
    return p
