"""`--draft llamacpp`: llama.cpp (llama-cpp-python, an optional extra) drafting from a GGUF file. Without the
package the spec fails in one line naming the install; with it (importorskip), the target's exact law by
enumeration, the test's power, greedy equality, and a cache that follows the text."""

import sys

import numpy as np
import pytest
import torch
from laws import tv, tv_threshold

from helpers import run_cli
from specview.core.settings import SamplingConfig
from specview.engine import accept_rule
from specview.engine.decoder import Decoder
from specview.engine.sampling import probs_from_logits
from specview.models.loader import load_model
from tiny import write_tiny_gguf

PROMPT = [256, 257, 258]  # " t", "he", " the"
SAMPLES = 3000


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """A tiny target GGUF and, with other random weights, a draft that often disagrees with it."""
    folder = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(folder / "target.gguf", seed=0), write_tiny_gguf(folder / "draft.gguf", seed=1)


@pytest.fixture(scope="module")
def target(ggufs):
    return load_model(ggufs[0], torch.device("cpu"))


def test_without_llama_cpp_python_one_line_and_exit_2(capsys, ggufs, monkeypatch):
    for name in [m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails, installed or not
    code, out, err = run_cli(capsys, "run", "--target", ggufs[0], "--draft", "llamacpp", "-N", "4")
    assert code == 2 and "Traceback" not in err
    assert "llama-cpp-python is not installed" in err and 'pip install -e ".[llamacpp]"' in err


@pytest.mark.parametrize("draft, message", [
    ("llamacpp;tree:b=2", "llamacpp drafts chains only"),
    ("llamacpp:/no/such.gguf", "is not a .gguf file"),
])
def test_bad_llamacpp_specs_are_one_line(capsys, ggufs, draft, message):
    code, out, err = run_cli(capsys, "run", "--target", ggufs[0], "--draft", draft, "-N", "4")
    assert code == 2 and message in err and "Traceback" not in err


def test_a_target_that_is_no_gguf_file_needs_a_path(small_llama_pair):
    from specview.core.errors import SpecviewError
    from specview.drafters.llamacpp import gguf_file

    with pytest.raises(SpecviewError, match="not a .gguf file; name one with llamacpp:PATH.gguf"):
        gguf_file("llamacpp", "some/folder")


def _drafter(path, target):
    pytest.importorskip("llama_cpp")
    from specview.drafters.llamacpp import LlamaCppDrafter

    return LlamaCppDrafter(f"llamacpp:{path}", path, target.logits_dim, target.context_len)


def exact_top_k_law(target, cfg: SamplingConfig, k_tokens: int = 3) -> dict[tuple, float]:
    """P(t1, t2, t3 | PROMPT) by enumeration over the only tokens top-k leaves (top_k ** 3 sequences): the
    tiny GGUF's 261 tokens are too many to enumerate all."""
    law = {(): 1.0}
    for _ in range(k_tokens):
        grown = {}
        for seq, mass in law.items():
            with torch.no_grad():
                logits = target.model(torch.tensor([PROMPT + list(seq)])).logits[0, -1]
            probs = probs_from_logits(logits, cfg)
            for token in torch.nonzero(probs).flatten().tolist():
                grown[seq + (token,)] = mass * float(probs[token])
        law = grown
    return law


def law_test(target, drafter, cfg):
    """(tv, threshold, drafted, rejected) of SAMPLES runs' first three tokens against the exact law; a sequence
    outside the law's support counts in a last cell of probability 0."""
    law = exact_top_k_law(target, cfg)
    index = {seq: i for i, seq in enumerate(law)}
    exact = np.array([*law.values(), 0.0])
    counts, drafted, rejected = np.zeros(len(exact)), 0, 0
    decoder = Decoder(target, drafter, cfg, k=2, seed=7, ignore_eos=True)
    for _ in range(SAMPLES):
        run = decoder.start(PROMPT, 3)
        while not run.done:
            step = run.step()
            drafted += len(step.drafted)
            rejected += step.rejected_at is not None
        counts[index.get(tuple(run.generated), len(law))] += 1
    return tv(counts, exact), tv_threshold(exact, samples=SAMPLES), drafted, rejected


def test_the_target_law_holds_with_a_llamacpp_draft(ggufs, target):
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    distance, threshold, drafted, rejected = law_test(target, _drafter(ggufs[1], target), cfg)
    assert drafted > SAMPLES and rejected > SAMPLES // 10, "the draft must propose, and be rejected, often"
    assert distance < threshold


def test_the_law_test_has_power_with_a_llamacpp_draft(ggufs, target, monkeypatch):
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    distance, threshold, _, _ = law_test(target, _drafter(ggufs[1], target), SamplingConfig(temperature=1.0, top_k=3))
    assert distance > threshold


def test_greedy_with_a_llamacpp_draft_is_greedy_autoregressive(ggufs, target):
    greedy = SamplingConfig(temperature=0)
    want = [t for s in Decoder(target, None, greedy, ignore_eos=True).generate(PROMPT, 24) for t in s.emitted]
    got = list(Decoder(target, _drafter(ggufs[1], target), greedy, k=3, ignore_eos=True).generate(PROMPT, 24))
    assert [t for s in got for t in s.emitted] == want
    assert any(step.rejected_at is not None for step in got), "the draft must be rejected sometimes"


def test_its_cache_follows_the_text(ggufs, target):
    """After a rollback the next proposal reads logits as if the cut tokens had never been fed; its own file as
    draft (the target's) agrees with the target's next-token law."""
    drafter = _drafter(ggufs[0], target)
    drafter.new_state()
    first = drafter._feed(PROMPT + [5, 6]).clone()
    drafter.rollback(None, len(PROMPT))
    assert drafter.llm.n_tokens == len(PROMPT)
    torch.testing.assert_close(drafter._feed([5, 6]), first)
    with torch.no_grad():
        want = target.model(torch.tensor([PROMPT + [5, 6]])).logits[0, -1]
    torch.testing.assert_close(first, want, rtol=1e-3, atol=5e-3)  # the same float32 weights, float16 keys/values


def test_its_distributions_are_recorded_for_whatif(capsys, ggufs, tmp_path):
    """--record-dists keeps a llama.cpp draft's q along the text as a model draft's (sampled, not a lookup)."""
    import gzip
    import json

    pytest.importorskip("llama_cpp")
    spec = f"llamacpp:{ggufs[1]}"
    code, out, err = run_cli(capsys, "run", "--target", ggufs[0], "--draft", spec, "--prompt", "the theme",
                             "-N", "8", "--temperature", "0", "--ignore-eos", "--record-dists", "--profile-dir",
                             str(tmp_path), "-q")
    assert code == 0, err
    (path,) = tmp_path.glob("*.dists.json.gz")
    record = json.loads(gzip.decompress(path.read_bytes()))
    drafter = record["runs"][0]["drafters"][spec] if "runs" in record else record["drafters"][spec]
    assert drafter["kind"] == "model" and len(drafter["argmax"]) == 8


def test_its_own_file_as_draft_is_accepted_run_after_run(ggufs, target):
    """The target's own file (the same float32 weights, other kernels) agrees with it at greedy, over two runs
    of other prompts and with another drafter in between: the cache is emptied per run and follows the text."""
    from specview.drafters.ngram import NgramDrafter

    drafter = _drafter(ggufs[0], target)
    greedy = SamplingConfig(temperature=0)
    accepted = drafted = 0
    for prompt in (PROMPT, [258, 256, 257, 100, 101]):
        decoder = Decoder(target, drafter, greedy, k=3, ignore_eos=True)
        run = decoder.start(prompt, 24)
        for i in range(100):
            if run.done:
                break
            if i == 2:
                decoder.drafter = NgramDrafter("ngram")  # the TUI's d: the llama.cpp cache sits a step out
            elif i == 3:
                decoder.drafter = drafter
            step = run.step()
            if decoder.drafter is drafter:
                accepted, drafted = accepted + step.accepted, drafted + len(step.drafted)
    assert drafted > 20 and accepted >= 0.9 * drafted


def test_the_recorded_rows_are_its_logits_along_the_text(ggufs, target):
    drafter = _drafter(ggufs[0], target)
    drafter.new_state()
    drafter._feed(PROMPT[:-1])
    text = [PROMPT[-1], 5, 6, 7]
    rows = drafter.logits_along(text)
    with torch.no_grad():
        want = target.model(torch.tensor([PROMPT + [5, 6, 7]])).logits[0, len(PROMPT) - 1:]
    # each row its own position's, not the last one's; llama.cpp keeps keys and values in float16: 1e-3 apart
    torch.testing.assert_close(rows, want, rtol=1e-3, atol=5e-3)
    assert not torch.allclose(rows[0], rows[-1], atol=0.1)


def test_past_its_cache_the_run_is_refused_before_it_starts(capsys, ggufs, monkeypatch):
    pytest.importorskip("llama_cpp")
    from specview.drafters import llamacpp

    monkeypatch.setattr(llamacpp, "MAX_CONTEXT", 16)
    code, out, err = run_cli(capsys, "run", "--target", ggufs[0], "--draft", "llamacpp", "--prompt", "the theme",
                             "-N", "20")
    assert code == 2 and "past the context of llamacpp (16)" in err and "Traceback" not in err
