"""The command line's shared pieces: a parser whose usage errors are one line, typed numbers with their
rules, and the options every command takes (docs/design/cli.md). No textual and no torch
here (`specview --help` stays instant): bench and run import this, the TUI is reached only through cli.main."""

from __future__ import annotations

import argparse

from specview.core.settings import Settings

DEFAULTS = Settings()


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line (the contract), with a pointer to --help; a parser with an epilog
    prints it and its description as written (their lines are wrapped by hand), one without wraps them."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("epilog"):
            kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def number_type(kind, name: str, ok, rule: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {text}")
        return value

    parse.__name__ = name  # argparse names the option in its message from this
    return parse


def policy_type(text: str) -> str:
    from specview.core.errors import SpecviewError
    from specview.core.policies import parse_policy

    try:
        return parse_policy(text)
    except SpecviewError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--draft-policy {text}: ")) from None


policy_type.__name__ = "--draft-policy"


def policies_type(text: str) -> str:
    """bench's and eval's --draft-policy: one policy or a comma-separated list, kept as its canonical string
    (Settings.draft_policy; policies.parse_policies splits it again)."""
    from specview.core.errors import SpecviewError
    from specview.core.policies import parse_policies

    try:
        return ",".join(parse_policies(text))
    except SpecviewError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--draft-policy {text}: ")) from None


policies_type.__name__ = "--draft-policy"


def allow_policy_list(p: argparse.ArgumentParser, command: str) -> None:
    """bench and eval time several policies side by side: --draft-policy takes a list there."""
    for action in p._actions:
        if action.dest == "draft_policy":
            action.type = policies_type
            action.metavar = "POLICY[,POLICY..]"
            action.help += f"; a comma-separated list like fixed,p-min=0.6,goodput: {command} runs each side by side"


def add_run_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    # --target_model_name / --approx_model_name / --input / -v: the flags of the seed project
    # (feifeibear/LLMSpeculativeSampling), accepted so its users' commands work as they are.
    g.add_argument("--target", "--target-model", "--target_model_name", default=DEFAULTS.target, metavar="MODEL",
                   help=f"the model whose distribution the output follows (default {DEFAULTS.target})")
    g.add_argument("--draft", "--draft-model", "--approx_model_name", default=DEFAULTS.draft, metavar="SPEC[,SPEC..]",
                   help="what proposes K tokens per step: MODEL[@dtype] (dtype float32, bfloat16, float16, int4 or int4+head), "
                        "ngram[:max=4,min=1] (prompt lookup), self:skip=4-9,15 or self:auto (the target skipping "
                        "layers); a suffix ';tree:b=2,d=4' (b children per node, depth d; w=1 expands only the "
                        "likeliest node of each level) or ';tree:nodes=16' (EAGLE-2's dynamic tree) drafts a token "
                        "tree, verified in one forward (quote the ';' from the shell); a comma-separated list for "
                        f"bench, eval and the TUI's d key (default {DEFAULTS.draft})")
    g.add_argument("--device", default=DEFAULTS.device, choices=["auto", "cpu", "cuda", "mps"],
                   help="auto picks cuda, then mps, then cpu")
    g.add_argument("--threads", type=number_type(int, "--threads", lambda v: v >= 1, ">= 1"), default=DEFAULTS.threads,
                   help="torch CPU threads (default: one fewer than the cores, at least 1: a neighbour, or the TUI's "
                        "screen, then takes the free core instead of one a thread of ours waits on)")
    g.add_argument("--device-map", default=DEFAULTS.device_map, metavar="auto|balanced|FILE.json",
                   help="spread the models' layers over several devices (transformers / accelerate device_map): "
                        "auto, balanced, or a JSON file mapping module names to devices; inputs go to the first "
                        "device, logits come from the last")
    g.add_argument("--max-memory", default=DEFAULTS.max_memory, metavar="DEV=SIZE[,..]",
                   help="with --device-map: the most each device may hold, e.g. 0=20GiB,1=20GiB,cpu=60GiB")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="the coloured origin stream (the default of `run`; accepted for the seed project's -v)")
    g.add_argument("--compile", default=DEFAULTS.compile, choices=["auto", "on", "off"],
                   help="the decode forward: on = specview's own forward for Llama-family models with one-token "
                        "steps compiled by torch.compile (inductor; cached on disk, so only the first start "
                        "compiles), off = transformers' forward (every layernorm timed), auto = on where a probe "
                        "on this machine finds it faster (default auto; the choice is kept per machine)")
    g.add_argument("--no-cache", dest="cache", action="store_false",
                   help="convert a .gguf on every start instead of using (and filling) the converted-weights cache "
                        "in $SPECVIEW_CACHE_DIR, $XDG_CACHE_HOME/specview or ~/.cache/specview")
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", "--input-str", "--input", default=DEFAULTS.prompt, help="the prompt text ('' starts from BOS)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("-N", "--max-new-tokens", "--N", dest="max_new_tokens", default=DEFAULTS.max_new_tokens,
                   type=number_type(int, "-N", lambda v: v >= 1, ">= 1"), help=f"tokens to generate (default {DEFAULTS.max_new_tokens})")
    g.add_argument("-K", "--K", dest="k", default=DEFAULTS.k, type=number_type(int, "-K", lambda v: v >= 1, ">= 1"),
                   help=f"tokens drafted per step (default {DEFAULTS.k})")
    g.add_argument("--draft-policy", default=DEFAULTS.draft_policy, type=policy_type, metavar="POLICY",
                   help="how many of the K tokens to draft each step: fixed (K, the default), p-min=X (stop at a "
                        "draft token whose top probability is below X, as llama.cpp's --draft-p-min), heuristic "
                        "(+2 after a block accepted whole, -1 otherwise, as transformers) or goodput (the budget "
                        "with the most predicted tokens/s from this run's acceptance and costs); every policy "
                        "keeps the output the target's")
    g.add_argument("--temperature", default=DEFAULTS.temperature, type=number_type(float, "--temperature", lambda v: v >= 0, ">= 0"),
                   help=f"0 = greedy for both models (default {DEFAULTS.temperature})")
    g.add_argument("--top-k", default=DEFAULTS.top_k, type=number_type(int, "--top-k", lambda v: v >= 0, ">= 0 (0 = off)"),
                   help="keep the k most likely tokens; 0 = off (default)")
    g.add_argument("--top-p", default=DEFAULTS.top_p, type=number_type(float, "--top-p", lambda v: 0 < v <= 1, "in (0, 1]"),
                   help="nucleus sampling mass; 1.0 = off (default)")
    g.add_argument("--seed", default=DEFAULTS.seed, type=number_type(int, "--seed", lambda v: v >= 0, ">= 0"),
                   help="seeds the one random generator of the process (default 0)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")
    g.add_argument("--profile-dir", default=None, metavar="DIR",
                   help=f"where profile files go (default {DEFAULTS.profile_dir}/)")


EPILOG = """\
commands:
  specview [OPTIONS]          the TUI: step through drafted blocks live (needs a terminal)
  specview run [OPTIONS]      headless: coloured token stream + summary (--jsonl for events)
  specview bench [OPTIONS]    autoregressive vs speculative (and peers), timed side by side
  specview report FILE [B]    render a profile, bench or eval file; with two, compare them
  specview eval [OPTIONS]     a prompt set through autoregressive and each drafter, per category
  specview check [OPTIONS]    is this pair's output the target's? (greedy + distribution test)
  specview calibrate [OPTS]   this machine's cost curve: target ms by rows, draft ms per token
  specview whatif PROFILE     replay a profile recorded with --record-dists at other K, policies, drafters
  specview doctor [--retake]  the forward and kernels kept for this machine, their load and age; take them again
  specview serve [OPTIONS]    the engine behind HTTP (POST /generate, SSE streams, /metrics)
  specview --attach URL       the TUI on a running `specview serve`

MODEL is a hub id (gpt2-xl), a save_pretrained folder, a .gguf file or the bundled
smollm2-135m, with an optional @float32/@bfloat16/@float16/@int4/@int4+head suffix. --draft also
takes ngram[:max=4,min=1] and self:skip=LAYERS / self:auto, or a list of drafters.
Colours in the token stream: green = accepted draft token, red = resampled after a
rejection, blue = bonus token (all K drafts accepted).
"""


def build_tui_parser() -> Parser:
    p = Parser(prog="specview", description="See and measure speculative decoding. With no command: the TUI.",
               epilog=EPILOG)
    add_run_options(p)
    g = p.add_argument_group("attach (the TUI on a remote `specview serve`)")
    g.add_argument("--attach", metavar="URL", help="watch a `specview serve` at URL (e.g. http://127.0.0.1:5000) "
                                                   "instead of loading models here")
    g.add_argument("--token", help="the server's --token, sent as `Authorization: Bearer TOKEN`")
    g.add_argument("--follow", action="store_true",
                   help="with --attach: show every request anyone sends (GET /events) instead of sending your own")
    return p


def build_run_parser() -> Parser:
    p = Parser(prog="specview run", description="Headless run: coloured token stream, then a summary.",
               epilog=EPILOG)
    add_run_options(p)
    g = p.add_argument_group("run")
    g.add_argument("--method", choices=["speculative", "autoregressive"], default="speculative",
                   help="autoregressive = the target alone, same code path (default speculative)")
    g.add_argument("--num-runs", "-R", default=1, type=number_type(int, "--num-runs", lambda v: v >= 1, ">= 1"),
                   help="independent samples in one process, one generator (default 1)")
    g.add_argument("--jsonl", metavar="PATH|-", help="write the event stream (one JSON per line); - = stdout")
    g.add_argument("--profile", action="store_true", help="write a profile to --profile-dir (default profiles/)")
    g.add_argument("--profile-ops", action="store_true",
                   help="also capture every operator with torch.profiler (own Chrome trace + top-operators table; "
                        "slows the run; implies --profile)")
    g.add_argument("--py-spy", action="store_true",
                   help="also sample the process with py-spy (speedscope file beside the profile; implies --profile)")
    g.add_argument("--record-dists", action="store_true",
                   help="also keep, beside the profile (<stem>.dists.json.gz), the target's and each drafter's "
                        "distribution along the emitted text, for `specview whatif` (one forward per model after "
                        "the run; implies --profile)")
    g.add_argument("--quiet", "-q", action="store_true", help="no token stream, only the summary")
    return p


def build_check_parser() -> Parser:
    p = Parser(prog="specview check",
               description="Is this pair's output the target's? Greedy speculative decoding against autoregressive "
                           "decoding over a few prompts, and a chi-square test of the first speculative token against "
                           "the target's exact distribution at your temperature / top-k / top-p (and of the tokens each "
                           "step emits after its first, the bonus among them, against the target's law after the "
                           "tokens before them). Exit 0 (result=pass) when both pass, 1 (result=fail) when either "
                           "fails, 3 (result=inconclusive) when nothing failed but the distribution test could not "
                           "tell: no power (a near one-token law) or the drafter proposed nothing (the target "
                           "alone); the last line sums it up for scripts.",
               epilog=EPILOG)
    add_run_options(p)
    g = p.add_argument_group("check")
    g.add_argument("--samples", "-M", default=1000, type=number_type(int, "--samples", lambda v: v >= 20, ">= 20"),
                   help="speculative steps from the first prompt for the distribution test (default 1000)")
    g.add_argument("--prompts", default="quick", metavar="SET",
                   help="prompts for the greedy check: quick (--prompt and three more), or any of eval's sets: "
                        "builtin (eval's 48), a Spec-Bench question.jsonl, JSONL with \"prompt\", or a text file, one "
                        "prompt a line (default quick)")
    g.add_argument("--threshold", default=0.001, type=number_type(float, "--threshold", lambda v: 0 < v < 1, "in (0, 1)"),
                   help="the distribution test fails when its p-value is below this (default 0.001: a correct "
                        "engine fails 1 check in 1000)")
    return p


def build_calibrate_parser():
    p = Parser(prog="specview calibrate",
               description="Measure this machine's cost curve: the target's forward time by rows (1 to 2K+1) and "
                           "each drafter's time per drafted token, fitted and kept per machine; diagnosis, "
                           "report, bench and whatif then predict with it.",
               epilog=EPILOG)
    add_run_options(p)
    g = p.add_argument_group("calibrate")
    g.add_argument("--repeats", default=9, type=number_type(int, "--repeats", lambda v: v >= 1, ">= 1"),
                   help="timed rounds, interleaving every row count (default 9; lower quartiles)")
    g.add_argument("--max-rows", default=None, type=number_type(int, "--max-rows", lambda v: v >= 2, ">= 2"),
                   help="rows up to this (default 2 max(K, 8) + 1)")
    g.add_argument("--no-plot", action="store_true", help="no terminal plot")
    return p
