"""Train an EAGLE-3 head for a target on this machine (`make train-head`: the bundled SmolLM2-135M), seeded, with
progress, written in the public format (specview/drafters/eagle3_checkpoint.py) where `--draft eagle3` finds it.

    python -m specview.tools.train_eagle3_head [--target smollm2-135m] [--out specview/data/eagle3-smollm2-135m]

The recipe is EAGLE-3's training-time test (docs/guide/drafters-and-trees.md says why): the head runs --ttt steps on
its own outputs, step s learning the target's distribution s + 1 tokens ahead, weighted 0.8^s as EAGLE-3 weights them;
the loss is the cross-entropy to the target's own distribution over the draft vocabulary (soft labels), counted where
the target's argmax is in that vocabulary and the predicted token is one the target wrote. The data is the target's
own text (specview/tools/eagle3_data.py). The draft vocabulary is the most frequent target ids of that text (d2t / t2d).
lm_head starts as the target's own output rows of those ids and `norm` as its final norm; the rest is random.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

from specview.drafters.eagle3_checkpoint import HeadConfig, default_aux_layers, save_head, target_shape
from specview.drafters.eagle3_head import Eagle3Head
from specview.tools import eagle3_data

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "eagle3-smollm2-135m")


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m", help="the target model spec (as --target takes it)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the checkpoint folder to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=128, help="tokens the target writes per prompt")
    p.add_argument("--data", help="keep the generated texts and hidden states in this file (reused when it exists)")
    p.add_argument("--data-only", action="store_true", help="stop once the data is made (and kept in --data)")
    p.add_argument("--draft-vocab", type=int, default=0, help="draft vocabulary (0: what fits --budget-mb)")
    p.add_argument("--intermediate", type=int, default=640, help="the head's MLP width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--budget-mb", type=float, default=9.5, help="the checkpoint's size, float16 (MB of 10^6 bytes)")
    p.add_argument("--ttt", type=int, default=4, help="training-time test steps (draft positions learned)")
    p.add_argument("--epochs", type=float, default=24.0, help="passes over the text (the head that ships: 24)")
    p.add_argument("--batch-tokens", type=int, default=2048, help="text positions per optimizer step")
    p.add_argument("--max-len", type=int, default=384, help="longest text trained on (longer ones keep their end)")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW's peak rate (warm-up, then cosine to 0)")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(msg, flush=True)


def draft_vocab_size(args, hidden: int, target_hidden: int) -> int:
    """The largest multiple of 256 whose lm_head fits the size budget beside the rest of the head (float16)."""
    if args.draft_vocab:
        return args.draft_vocab
    attn = 2 * hidden * (args.heads + 2 * args.kv_heads) * args.head_dim + args.heads * args.head_dim * hidden
    rest = 3 * target_hidden * hidden + attn + 3 * hidden * args.intermediate + 4 * hidden
    room = args.budget_mb * 1e6 - 2 * rest - 200_000  # d2t, t2d, the config and the file's header
    return max(256, int(room // (2 * hidden + 8)) // 256 * 256)


def build_vocab(texts, size: int, vocab: int):
    """(used target ids sorted, d2t, t2d) over the tokens the target wrote; the coverage is printed."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for text in texts:
        counts += torch.bincount(torch.tensor(text["ids"][text["prompt_len"]:]), minlength=vocab)
    top = torch.topk(counts, size).indices.sort().values
    say(f"draft vocabulary: {size} ids cover {float(counts[top].sum()) / float(counts.sum()):.1%} of the "
        f"{int(counts.sum())} tokens written")
    d2t = top - torch.arange(size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[top] = True
    return top, d2t, t2d


def make_data(args, lm, aux_layers):
    """The target's texts and its states over them; with --data, kept there (and the generated texts as they come, in
    DATA.partial: a stopped run starts again where it was)."""
    if args.data and os.path.exists(args.data):
        say(f"reading the generated texts from {args.data}")
        return torch.load(args.data, weights_only=False)
    partial = args.data + ".partial" if args.data else None
    done = torch.load(partial, weights_only=False) if partial and os.path.exists(partial) else {}

    def keep():
        if partial:
            torch.save(done, partial + ".tmp")
            os.replace(partial + ".tmp", partial)

    model, tok = lm.model, lm.tokenizer
    say("1/3 the target writes its own text" + (f" ({len(done)} batches done before)" if done else ""))
    texts = eagle3_data.generate(model, tok, eagle3_data.passage_prompts(args.seed), args.new_tokens, args.seed,
                                 say=say, done=done, keep=keep)
    passages = [tok.decode(t["ids"][t["prompt_len"]:], skip_special_tokens=True) for t in texts]
    items = eagle3_data.prompts(args.seed) + eagle3_data.quoting_prompts(passages, args.seed)
    texts += eagle3_data.generate(model, tok, items, args.new_tokens, args.seed + 1, say=say, done=done, keep=keep)
    say("2/3 the target's hidden states over its text")
    texts = eagle3_data.hidden_states(model, texts, aux_layers, say=say)
    if args.data:
        torch.save(texts, args.data)
        if partial and os.path.exists(partial):
            os.remove(partial)
    return texts


def examples(texts, max_len: int):
    """Per text, its last max_len positions as tensors: ids, aux, final, argmax, and the first position whose next
    token the target wrote (the loss starts there)."""
    out = []
    for text in texts:
        ids = torch.tensor(text["ids"])
        cut = max(0, ids.numel() - max_len)
        out.append({"ids": ids[cut:], "aux": text["aux"][cut:], "final": text["final"][cut:],
                    "argmax": text["argmax"][cut:], "first": max(0, text["prompt_len"] - 1 - cut)})
    return out


def batches(data, batch_tokens: int, rng: random.Random):
    order = sorted(range(len(data)), key=lambda i: data[i]["ids"].numel())
    groups, group = [], []
    for i in order:
        group.append(i)
        if len(group) * data[i]["ids"].numel() >= batch_tokens:
            groups.append(group)
            group = []
    if group:
        groups.append(group)
    rng.shuffle(groups)
    return groups


def collate(data, group):
    """Rows j = 0 .. T - 2 of each text padded to one length: ids (token j + 1), aux (state j), final and argmax of
    positions 1 .. T - 1 (the target's law of token j + 2), and which rows count (`valid`, before the step shift)."""
    length = max(data[i]["ids"].numel() for i in group) - 1
    width = data[group[0]]["aux"].shape[1]
    hidden = data[group[0]]["final"].shape[1]
    ids = torch.zeros(len(group), length, dtype=torch.long)
    aux = torch.zeros(len(group), length, width)
    final = torch.zeros(len(group), length, hidden)
    argmax = torch.zeros(len(group), length, dtype=torch.long)
    valid = torch.zeros(len(group), length, dtype=torch.bool)
    for row, i in enumerate(group):
        text = data[i]
        n = text["ids"].numel() - 1
        ids[row, :n] = text["ids"][1:]
        aux[row, :n] = text["aux"][:n].float()
        final[row, :n] = text["final"][1:].float()
        argmax[row, :n] = text["argmax"][1:]
        valid[row, text["first"]:n] = True
    return ids, aux, final, argmax, valid


def shifted(x: torch.Tensor, step: int) -> torch.Tensor:
    """x [B, T, ...] moved `step` rows up (row j gets row j + step), the tail zero."""
    if step == 0:
        return x
    return torch.cat([x[:, step:], torch.zeros_like(x[:, :step])], dim=1)


def loss_of(head, batch, target_rows, t2d, steps: int):
    """EAGLE-3's loss on one batch -> (loss, per-step share of counted rows where the head's argmax is the
    target's)."""
    ids, aux, final, argmax, valid = batch
    outs = head.ttt_forward(ids, head.fuse(aux), steps)
    total, hits = 0.0, []
    for step, logits in enumerate(outs):
        with torch.no_grad():
            p = torch.softmax(shifted(final, step) @ target_rows.T, dim=-1)  # the target's law over the draft ids
            counted = shifted(valid, step) & t2d[shifted(argmax, step)]
        logp = F.log_softmax(logits.float(), dim=-1)
        rows = counted.sum().clamp(min=1)
        total = total + 0.8 ** step * -(p * logp).sum(-1)[counted].sum() / rows
        hits.append(float(((logits.argmax(-1) == p.argmax(-1)) & counted).sum() / rows))
    return total, hits


def main(argv=None) -> int:
    args = options(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    from specview.models.loader import load_model

    lm = load_model(args.target, torch.device("cpu"))
    model = lm.model.float().eval()
    hidden, layers, vocab = target_shape(model)
    aux_layers = default_aux_layers(layers)
    texts = make_data(args, lm, aux_layers)
    if args.data_only:
        return 0
    size = draft_vocab_size(args, hidden, hidden)
    used, d2t, t2d = build_vocab(texts, size, vocab)
    rope = getattr(model.config, "rope_parameters", None) or {}
    cfg = HeadConfig(hidden_size=hidden, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                     intermediate_size=args.intermediate, eps=float(model.config.rms_norm_eps), vocab_size=vocab,
                     draft_vocab_size=size, target_hidden_size=hidden, aux_layers=aux_layers,
                     max_positions=int(model.config.max_position_embeddings),
                     rope_theta=float(rope.get("rope_theta", getattr(model.config, "rope_theta", 10000.0))))
    head = Eagle3Head(cfg, model.get_input_embeddings())
    target_rows = model.get_output_embeddings().weight.detach()[used].float()
    with torch.no_grad():
        head.lm_head.weight.copy_(target_rows)
        head.norm.weight.copy_(model.model.norm.weight)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    for p in model.parameters():
        p.requires_grad_(False)
    data = examples(texts, args.max_len)
    rng.shuffle(data)
    held = max(1, len(data) // 20)
    test, train = data[:held], data[held:]
    plan = batches(train, args.batch_tokens, rng)
    total = max(1, int(len(plan) * args.epochs))
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    warm = max(1, total // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warm) * 0.5 *
                                                 (1 + math.cos(math.pi * min(i, total) / total)))
    say(f"3/3 training: {len(train)} texts ({sum(d['ids'].numel() for d in train)} positions), {total} steps of "
        f"about {args.batch_tokens} positions, {args.ttt} training-time-test steps; {len(test)} texts held out")
    head.train()
    started, step, seen = time.perf_counter(), 0, []
    while step < total:
        for group in plan:
            if step >= total:
                break
            loss, hits = loss_of(head, collate(train, group), target_rows, t2d, args.ttt)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            seen.append(hits)
            if step % 10 == 0 or step == total:
                mean = [sum(h[s] for h in seen[-10:]) / len(seen[-10:]) for s in range(args.ttt)]
                elapsed = time.perf_counter() - started
                say(f"  step {step}/{total} loss {loss.item():.3f} top-1 agreement by position "
                    f"{' '.join(f'{m:.2f}' for m in mean)}  {elapsed / 60:.1f} min, about "
                    f"{elapsed / step * (total - step) / 60:.1f} min left")
        plan = batches(train, args.batch_tokens, rng)
    head.eval()
    with torch.no_grad():
        hits = [loss_of(head, collate(test, [i]), target_rows, t2d, args.ttt)[1] for i in range(len(test))]
    agreement = [sum(h[s] for h in hits) / len(hits) for s in range(args.ttt)]
    say(f"held-out top-1 agreement by position: {' '.join(f'{a:.2f}' for a in agreement)}")
    save_head(head, args.out, model.config.to_dict(), torch.float16,
              extra={"specview": {"target": args.target, "recipe": "EAGLE-3 training-time test", "seed": args.seed,
                                  "ttt_steps": args.ttt, "texts": len(train)}})
    size_mb = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out)) / 1e6
    say(f"wrote {args.out} ({size_mb:.1f} MB) in {(time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
