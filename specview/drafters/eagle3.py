"""EAGLE-3 drafting (Li et al. 2025): a one-layer head drafts from the target's own hidden states.

    eagle3:PATH     a checkpoint folder in the public format (eagle3_checkpoint.py: what vLLM and SGLang load)
    eagle3          the head shipped for the target (specview/data/eagle3-<name>/), if one ships

What the engine hands the drafter. The drafter names the target layers it reads (`target_layers`, the checkpoint's
eagle_aux_hidden_state_layer_ids or vLLM's default); the target's forwards that the engine runs anyway (the prefill
and each verify) return those layers' inputs for the rows they feed, and the engine passes the accepted rows on with
`take_hidden(state, start, aux)`: the states of positions start, start + 1, ... No second target forward.

The head's rows (eagle3_head.py): row p holds (the target's fused state at p, token p + 1) and predicts token p + 2.
Between steps the head's cache holds the rows of positions 0 .. real - 1, all fed with the target's states. A step's
proposal first feeds the rows the target's last verify made possible (positions real .. n - 2 for a text of n
tokens: one forward), whose last row gives q of the first draft; each later draft is one row fed with the previous
row's output (the head's own state) at the next position. Those drafted rows go at the rollback: the next step feeds
their positions again, with the target's states.

q is the head's distribution over its draft vocabulary mapped into the target's through d2t, after the same
temperature / top-k / top-p as p (engine/sampling.py): a token outside the draft vocabulary has q = 0, and the engine's
accept test and residual keep the target's law whatever the head proposes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.resources import files

import torch

from specview.core.errors import SpecviewError, quoted
from specview.engine.drafter import Proposal, sample_chain

SHIPPED = {"smollm2-135m": "eagle3-smollm2-135m"}  # target spec (before any @dtype) -> folder in specview/data


def shipped_head(target_spec: str) -> str:
    """The folder of the head that ships for `target_spec`; one line naming eagle3:PATH when none does."""
    name = target_spec.partition("@")[0]
    folder = SHIPPED.get(name)
    path = str(files("specview").joinpath("data", folder)) if folder else None
    if path is None:
        raise SpecviewError(f"--draft eagle3: no EAGLE-3 head ships for the target {quoted(target_spec)}; give one "
                            f"with --draft eagle3:PATH (a checkpoint folder: config.json and safetensors)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise SpecviewError(f"--draft eagle3: the head for {name} is not in this install ({path}): `make train-head` "
                            f"trains it, or give one with --draft eagle3:PATH")
    return path


@dataclass
class HeadState:
    """One run's head: its cache, how many of its rows hold the target's states (`real`), and the target's states of
    positions real, real + 1, ... not fed yet (`pending` [rows, 3 * target hidden])."""

    cache: object
    real: int = 0
    pending: torch.Tensor | None = None
    frontier: torch.Tensor | None = field(default=None, repr=False)  # a tree's last level: its rows' outputs

    def get_seq_length(self) -> int:
        """The head's cached rows (a tree's nodes are laid out after them)."""
        return self.cache.get_seq_length()


class Eagle3Drafter:
    def __init__(self, spec: str, head, target, head_path: str | None = None):
        self.spec = spec
        self.head = head  # an Eagle3Head
        self.head_path = head_path  # its checkpoint folder (a peer that serves the same head loads it from there)
        self.target = target  # the LoadedModel whose states it reads
        self.target_layers = tuple(head.cfg.aux_layers)
        self.lm = None  # no draft model: nothing for the engine to compile, move or hook
        self.tree_feeder = _TreeFeeder(self)

    def new_state(self) -> HeadState:
        return HeadState(self.head.new_cache())

    def prefill(self, run, state: HeadState, head: list[int]) -> None:
        """Nothing to run: the prefill's target forward hands its states over (take_hidden)."""

    def take_hidden(self, state: HeadState, start: int, aux: torch.Tensor) -> None:
        """The target's states of positions start, start + 1, ... ([rows, 3 * hidden]), from a forward it ran."""
        have = state.real + (0 if state.pending is None else state.pending.shape[0])
        if start > have:  # a gap (this drafter sat out some steps): the next proposal catches up on its own
            return
        if start < state.real:  # the target fed these positions again: the head's rows there go too
            self._crop(state, start)
        kept = state.pending[: start - state.real] if state.pending is not None else aux[:0]
        state.pending = torch.cat([kept, aux.to(kept.dtype)]) if kept.numel() else aux

    def rollback(self, state: HeadState, keep: int) -> None:
        """After a step: the drafted rows go (real rows only), and no state past `keep` stays."""
        self._crop(state, min(state.real, keep))
        if state.pending is not None:
            state.pending = state.pending[: max(0, keep - state.real)]

    def keep_rows(self, state: HeadState, base: int, rows: list[int]) -> None:
        """A tree's accepted path: nothing to keep, the drafted rows are fed again with the target's states."""

    def _crop(self, state: HeadState, length: int) -> None:
        cut = state.cache.get_seq_length() - length
        if cut > 0:
            state.cache.crop(-cut)
        if length < state.real:
            state.pending = None  # it followed the rows that went
        state.real = min(state.real, length)

    # ---- drafting ----

    def catch_up(self, run, state: HeadState, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the rows of positions real .. n - 2 with the target's states -> (target-vocabulary logits [V] of the
        last row, its output [1, H]); None when there is no row to feed (a text of one token: the target has no
        state yet)."""
        n = len(tokens)
        need = n - 1 - state.real
        if need <= 0:
            return None
        have = 0 if state.pending is None else state.pending.shape[0]
        if have < need:
            self._states_of_text(run, state, tokens)
        aux, state.pending = state.pending[:need], state.pending[need:]
        head = self.head
        device = aux.device
        ids = torch.tensor(tokens[state.real + 1: n], device=device)
        positions = torch.arange(state.real, n - 1, device=device)
        with torch.inference_mode():
            logits, out = head.rows(state.cache, ids, head.fuse(aux), positions)
        state.real = n - 1
        return self._mapped(run, logits[-1:])[0], out[-1:]

    def _states_of_text(self, run, state: HeadState, tokens: list[int]) -> None:
        """The target's states of the whole text but its last token, by a target forward of their own: only when the
        engine could not hand them over (this drafter took over a run another drafter started)."""
        from specview.engine.kv_cache import new_cache

        self._crop(state, 0)
        _, aux = run.forward(self.target, new_cache(self.target), tokens[:-1], keep=1, hidden_layers=self.target_layers)
        state.pending = aux

    def _mapped(self, run, logits: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(logits, run.vocab)

    def _row(self, run, state: HeadState, token: torch.Tensor, hidden: torch.Tensor, position: int):
        with torch.inference_mode():
            positions = torch.tensor([position], device=hidden.device)
            logits, out = self.head.rows(state.cache, token.view(1), hidden, positions)
        return self._mapped(run, logits)[0], out

    def propose(self, run, state: HeadState, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        n = len(tokens)
        last: dict = {}
        with run.timer.phase("draft"):
            first = self.catch_up(run, state, tokens)
        if first is None:
            return Proposal(torch.zeros(0, dtype=torch.long, device=run.device),
                            torch.zeros(0, run.vocab, device=run.device))
        last.update(logits=first[0], out=first[1], position=n - 1, fed=False)

        def feed(ids):
            if not last["fed"]:  # the first draft's logits come from the catch-up's last row
                last["fed"] = True
                return last["logits"]
            logits, last["out"] = self._row(run, state, ids, last["out"], last["position"])
            last["position"] += 1
            return logits

        return sample_chain(run, feed, None, k, keep_drafting)


    def logits_along_text(self, run, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
        """The head's first-draft logits at each generated position, fed the target's states of the text before it
        (one target forward, then the head's rows): row i is its law of generated[i] [len(generated), V]. For the
        profiles' recorded distributions and what-if (profiling/dists.py); a one-token prompt has no state for the
        first token: its row is the uniform law over the draft vocabulary."""
        from specview.engine.kv_cache import new_cache

        text = list(prompt_ids) + list(generated)
        if len(text) < 3:  # no state for any row
            return self._mapped(run, torch.zeros(len(generated), self.head.cfg.draft_vocab_size, device=run.device))
        _, aux = run.forward(self.target, new_cache(self.target), text[:-2], keep=1, hidden_layers=self.target_layers)
        head = self.head
        with torch.inference_mode():
            rows = torch.arange(aux.shape[0], device=aux.device)
            logits, _ = head.rows(head.new_cache(), torch.tensor(text[1:-1], device=aux.device), head.fuse(aux), rows)
        first = len(prompt_ids) - 2  # row p predicts token p + 2: generated[0] is token len(prompt)
        if first < 0:
            logits = torch.cat([logits.new_zeros(-first, logits.shape[1]), logits])
            first = 0
        return self._mapped(run, logits[first:first + len(generated)])

    def state_after_a_step(self, run, tokens: list[int], fed: int = 2) -> HeadState:
        """A state as a step leaves it (calibrate times propose() from it): the head's rows for all but the last `fed`
        positions of tokens[:-1], and the target's states of those handed over, so that propose() catches up `fed`
        rows (an accepted draft and the bonus) before its one-row drafts. One target forward, untimed."""
        from specview.engine.kv_cache import new_cache

        _, aux = run.forward(self.target, new_cache(self.target), tokens[:-1], keep=1, hidden_layers=self.target_layers)
        state = self.new_state()
        cut = max(0, aux.shape[0] - fed)
        self.take_hidden(state, 0, aux[:cut])
        if cut > 0:
            self.catch_up(run, state, tokens[:cut + 1])
        self.take_hidden(state, cut, aux[cut:])
        return state

    def model_bytes(self) -> dict:
        """The roofline's figures (profiling/roofline.py): the head's weights a draft reads (its layer, fc, lm_head;
        the embedding row is the target's), and its keys and values per token."""
        weights = sum(p.numel() * p.element_size() for name, p in self.head.named_parameters())
        cfg = self.head.cfg
        return {"weights": weights, "kv_per_token": 2 * cfg.kv_heads * cfg.head_dim * self.head.fc.weight.element_size()}


class _TreeFeeder:
    """How TreeDrafter grows a tree from the head (drafters/tree.py): the catch-up gives the root's children's law;
    each level's nodes are rows fed with their parent's row output, at the depth's position, seeing the text's rows
    and their ancestors. The head's text rows end at n - 1 (one before a draft model's), which is the base of
    token_tree.append_layout's positions. The drafted rows are not kept (keeps_rows False): the rollback drops them."""

    keeps_rows = False

    def __init__(self, drafter: Eagle3Drafter):
        self.drafter = drafter

    def start(self, run, state: HeadState, tokens: list[int]):
        """-> (logits [1, V] of the root's children, the base of the nodes' rows) or None (nothing to draft from)."""
        first = self.drafter.catch_up(run, state, tokens)
        if first is None:
            return None
        state.frontier = first[1]
        return first[0].view(1, -1), len(tokens) - 1

    def feed(self, run, state: HeadState, ids: torch.Tensor, from_rows: list[int], layout) -> torch.Tensor:
        """Nodes `ids` whose parents are rows `from_rows` of the last level fed -> their logits [m, V]. `layout` =
        (positions, allowed) from append_layout, or None: one node continuing the nodes fed so far (a chain)."""
        head = self.drafter.head
        hidden = state.frontier[torch.tensor(from_rows, device=state.frontier.device)]
        if layout is None:
            positions, allowed = torch.tensor([state.cache.get_seq_length()], device=hidden.device), None
        else:
            positions, allowed = layout
        with torch.inference_mode():
            logits, out = head.rows(state.cache, ids.view(-1), hidden, positions, allowed)
        state.frontier = out
        return self.drafter._mapped(run, logits)


def build(spec: str, target) -> Eagle3Drafter:
    """`eagle3` or `eagle3:PATH` for `target` (a LoadedModel): the head loaded and checked."""
    from specview.drafters.eagle3_checkpoint import load_head

    _, colon, path = spec.partition(":")
    if colon and not path:
        raise SpecviewError(f"--draft {quoted(spec)}: name the checkpoint folder, eagle3:PATH (or eagle3 alone for "
                            f"the head that ships for the target)")
    path = os.path.expanduser(path) if path else shipped_head(target.spec)
    dtype = target.dtype if target.dtype.is_floating_point else torch.float32
    head = load_head(path, target.model, dtype=dtype).to(target.device)
    return Eagle3Drafter(spec, head, target, head_path=path)
