"""GPT-2 XL and GPT-2 shapes with random weights, built locally: the mission's pair (`--target gpt2-xl --draft
gpt2`) where no model hub is reachable. A forward's time and memory depend on the shapes, not on the values, so
these time as the real ones do; their text is noise and their acceptance is not the real pair's.

    python -m specview.tools.random_pair DIR        # DIR/gpt2-xl and DIR/gpt2 (about 6.7 GB in float32)
    specview bench --target DIR/gpt2-xl --draft DIR/gpt2

Both share one word-level tokenizer of GPT-2's vocabulary size (50257), so the pair passes the shared-vocabulary
check like the real one.
"""

from __future__ import annotations

import argparse
import os
import sys

SHAPES = {  # name -> (layers, width, heads): GPT-2's published configurations
    "gpt2-xl": (48, 1600, 25),
    "gpt2": (12, 768, 12),
}
VOCAB = 50257
CONTEXT = 1024


def build(folder: str, name: str, seed: int = 0) -> str:
    """Write one random model of `name`'s shape to folder/name (kept when it is already there)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = os.path.join(folder, name)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    layers, width, heads = SHAPES[name]
    words = ["<|endoftext|>"] + [f"w{i}" for i in range(VOCAB - 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                        unk_token="<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=width, n_layer=layers, n_head=heads)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specview.tools.random_pair", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="where to write gpt2-xl/ and gpt2/ (kept when already there)")
    parser.add_argument("--only", choices=sorted(SHAPES), help="build one of the two")
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    for name in [args.only] if args.only else list(SHAPES):
        print(f"{name}: {build(args.folder, name)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
