"""`specview whatif PROFILE`: replay a profile recorded with `--record-dists` at other K, draft policies and
drafters, with the machine's cost curve (analysis/whatif.py holds the arithmetic; this prints and writes it)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table

from specview.analysis.whatif import ORACLE, Replay, load_dists, plain, whatif_document
from specview.core.draft_spec import parse_draft, parse_drafts
from specview.core.errors import SpecviewError
from specview.core.events import fmt
from specview.core.file_schemas import load as load_document

DEFAULT_KS = (1, 2, 3, 4, 6, 8)


def build_whatif_parser():

    from specview.core.options import Parser

    p = Parser(prog="specview whatif",
               description="Replay a profile recorded with `run --record-dists` at other K, draft-length policies "
                           "and drafters, without running the models: expected tokens per step (exact for greedy), "
                           "acceptance per position, the oracle bound, the predicted speedup on this machine's cost "
                           "curve (`specview calibrate`) and where each step's time is lost.")
    p.add_argument("profile", metavar="PROFILE", help="a profile .json (its .dists.json.gz beside it) or the .dists.json.gz")
    p.add_argument("-K", "--k", default=None, metavar="K[,K..]", help=f"K values (default {','.join(map(str, DEFAULT_KS))} and the profile's)")
    p.add_argument("--draft-policy", "--policy", dest="policies", default="fixed", metavar="POLICY[,..]",
                   help="fixed, p-min=X, heuristic, goodput, or a list (default fixed)")
    p.add_argument("--drafter", default=None, metavar="SPEC[,..]",
                   help="recorded drafters to replay (default all); at greedy, a recorded model drafter with a suffix "
                        "';tree:b=2,d=4,w=1[,min=P]' replays that token tree: the chain with siblings beside "
                        "its nodes (quote the ';')")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON (specview.whatif/1)")
    p.add_argument("--no-plot", action="store_true", help="no terminal plot")
    return p


def locate(path: str) -> tuple[dict, str]:
    """(profile document, dists path) from either file."""
    from specview.core.file_schemas import PROFILE_SCHEMA

    if path.endswith(".dists.json.gz"):
        return load_document(path[: -len(".dists.json.gz")] + ".json")[1], path
    path, doc = load_document(path)  # a folder: its newest profile
    if doc.get("schema") != PROFILE_SCHEMA:
        raise SpecviewError(f"{path} is not a profile (schema {doc.get('schema')}): whatif replays a profile")
    name = ((doc.get("meta") or {}).get("files") or {}).get("dists")
    dists = os.path.join(os.path.dirname(path), name) if name else path[: -len(".json")] + ".dists.json.gz"
    if not os.path.exists(dists):
        raise SpecviewError(f"{path} has no distributions beside it: record them with `specview run --record-dists`")
    return doc, dists


def parse_ks(text: str | None, profile_k) -> list[int]:
    if text is None:
        return sorted(set(DEFAULT_KS) | ({profile_k} if isinstance(profile_k, int) and profile_k > 0 else set()))
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecviewError(f"-K {text!r}: give integers, e.g. 2,4,8") from None
    if not ks or ks[0] < 1 or ks[-1] > 64:
        raise SpecviewError(f"-K {text!r}: each K between 1 and 64")
    return ks


def table(spec: str, entry: dict) -> Table:
    t = Table(title=f"drafter {spec} · costs from {entry['costs'] or 'nowhere (no t_ar in the profile)'}",
              title_justify="left")
    for col in ("policy", "K", "tokens/step", "accept", "drafted/step", "nodes/step", "speedup", "forwards only",
                "lost: drafts", "rows", "overhead ms/step"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in entry["_objects"]:
        lost = r.to_json()["lost_ms_per_step"]
        t.add_row(r.policy + ("" if r.exact else " ~"), str(r.k) if r.policy != ORACLE else f"<={r.k}",
                  fmt(r.tokens_per_step), fmt(r.acceptance_rate, "{:.1%}"), fmt(r.drafted / r.steps if r.steps else None),
                  fmt(r.nodes / r.steps if r.steps else None), fmt(r.speedup, "{:.2f}x"), fmt(r.theoretical_speedup, "{:.2f}x"),
                  fmt(lost["drafts_thrown_away"], "{:.1f}"), fmt(lost["verify_rows_wasted"], "{:.1f}"),
                  fmt(lost["overhead_outside_forwards"], "{:.1f}"),
                  style="dim" if r.policy == ORACLE else None)
    return t


def positions_table(spec: str, r: Replay) -> Table:
    j = r.to_json()
    t = Table(title=f"{spec} at K={r.k} ({r.policy}): acceptance per draft position", title_justify="left")
    t.add_column("position", justify="right")
    t.add_column("P(accepted)", justify="right")
    t.add_column("P(accepted | earlier accepted)", justify="right")
    for i, (u, c) in enumerate(zip(j["per_position_acceptance"], j["conditional_position_acceptance"])):
        t.add_row(str(i + 1), fmt(u, "{:.1%}"), fmt(c, "{:.1%}"))
    return t


def terminal_plot(doc: dict, color: bool, width: int = 90, height: int = 16):
    import plotext as plt
    from rich.text import Text

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    for spec, entry in doc["drafters"].items():
        fixed = [r for r in entry["_objects"] if r.policy == "fixed"]
        ys = [r.speedup for r in fixed]
        if fixed and all(y is not None for y in ys):
            plt.plot([r.k for r in fixed], ys, label=spec, marker="dot")
    plt.title("predicted speedup by K (fixed policy)")
    plt.xlabel("K")
    out = plt.build()
    plt.clear_figure()
    return Text.from_ansi(out) if color else Text(plt.uncolorize(out))


def whatif_command(args) -> int:
    from specview.core.files import write_json_atomic

    profile, dists_path = locate(args.profile)
    dists = load_dists(dists_path)
    ks = parse_ks(args.k, (profile.get("meta") or {}).get("k"))
    from specview.core.policies import parse_policy

    policies = [parse_policy(p) for p in args.policies.split(",") if p.strip()]
    recorded_specs = list(dists["runs"][0]["drafters"]) if dists["runs"] else []
    drafters = [d.text for d in parse_drafts(args.drafter)] if args.drafter else recorded_specs
    for d in drafters:
        if d not in recorded_specs and parse_draft(d).base not in recorded_specs:
            raise SpecviewError(f"--drafter {d}: not recorded in {dists_path} (recorded: {', '.join(recorded_specs)}; "
                                "a recorded drafter with a ';tree:...,w=1' suffix replays a tree)")
    doc = whatif_document(profile, dists, ks, policies, drafters)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a pipe defaults to 80 columns: keep the headers whole
    rec = doc["recorded"]
    console.print(f"{doc['tokens']} tokens recorded, {'greedy (exact replay)' if doc['greedy'] else 'sampling'}; "
                  f"the run itself: {rec['drafter']} K={rec['k']} {rec['policy']}: {fmt(rec['tokens_per_step'])} "
                  f"tokens/step measured · {doc['cpu']}, {doc['threads']} thread(s)", soft_wrap=True)
    for spec, entry in doc["drafters"].items():
        console.print(table(spec, entry))
        own = next((r for r in entry["_objects"] if r.policy == "fixed" and r.k == rec["k"]), None)
        if own is not None:
            console.print(positions_table(spec, own))
    if not args.no_plot:
        console.print(terminal_plot(doc, console.is_terminal))
    if args.json:
        write_json_atomic(args.json, plain(doc), indent=1)
        Console(stderr=True).print(f"written: {args.json}", soft_wrap=True)
    return 0


def parse(argv: list[str]):
    return build_whatif_parser().parse_args(argv)


def run(args) -> int:
    return whatif_command(args)
