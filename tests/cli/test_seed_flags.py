"""The seed project's flags (--target_model_name, --approx_model_name, --input, -v) work as aliases."""

import json

from helpers import run_cli


def test_the_seed_flags_are_aliases(capsys, gpt2_paths):
    code, out, err = run_cli(capsys, "run", "--target_model_name", gpt2_paths[0], "--approx_model_name", gpt2_paths[1],
                             "--input", "w1 w2", "-v", "-N", "4", "--jsonl", "-", "--ignore-eos")
    assert code == 0, err
    start = json.loads(out.splitlines()[0])
    assert start["target"] == gpt2_paths[0] and start["draft"] == gpt2_paths[1] and start["prompt_ids"] == [4, 5]
