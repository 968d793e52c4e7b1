"""The target's exact law on the path a user gets by default: `specview run --draft MODEL@int4+head` with `--compile
auto`, which puts the float32 target and its int4 draft (output head included) on the engine's own forward, built ahead
of time (AOTInductor packages). The rest of the suite runs transformers' forward (conftest: SPECVIEW_COMPILE=0,
SPECVIEW_AOT=0); here both are lifted, the models load through the loader's spec suffix and the session opens as
`run`'s does, and transformers' forward is made to fail while sampling, so the law cannot be measured on it by
mistake. The law test and its power controls are test_lossless.py's (tests/support/laws.py)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from build_cache import kept_folder
from laws import SAMPLES, decoder_counts, exact_joint, tv, tv_threshold

import specview.engine.accept_rule as accept_rule
import tiny
from specview.core.settings import Settings
from specview.cpu import forward_choice
from specview.cpu.forward import aot_compile, llama
from specview.session import open_session

VOCAB = 8  # 8^3 sequences of three tokens: the joint law is enumerated
HEAD_ROWS = 16  # logits past the tokenizer's 8 (sliced off): the int4 kernel takes output rows 16 at a time
# The first session of a checkout, or the first after an edit of the forward's code, builds the two models' packages
# (user_cache) in the first test's setup: longer than pyproject's limit per test allows on a busy machine. Later
# sessions load them.
pytestmark = pytest.mark.timeout(1200)


def user_cache() -> Path:
    """The cache folder of this file's sessions, kept between the test sessions of the machine like the thin kernels'
    library (build_cache.py): what a user's cache holds after a first start (the AOT packages, the kernels each probe chose),
    one folder per version of the forward's code (build_cache.kept_folder). A probe's choice of kernel changes what
    a package is built for, so the choices are kept with the packages: later sessions load, as a user's second
    start does. Each package's own name carries the digests of the files it was built from besides."""
    folder = kept_folder("test-default-path")
    # the session's the thin kernels build folder and inductor cache (conftest.py), not a second build of either
    for shared in ("thin_kernels", "inductor"):
        link = folder / shared
        if link.is_symlink():
            link.unlink()
        elif link.exists():  # a folder of its own, from before the sessions shared one
            shutil.rmtree(link)
        link.symlink_to(os.path.realpath(Path(os.environ["SPECVIEW_CACHE_DIR"]) / shared))
    return folder


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """`specview run`'s session of a tiny float32 Llama target and `<its noisy copy>@int4+head`, on the forward
    `--compile auto` installs (Settings' defaults: K, temperature, seed, draft policy as a user gets them)."""
    if aot_compile.unavailable_reason() is not None:
        pytest.skip(f"cannot compile here: {aot_compile.unavailable_reason()}")
    folder = tmp_path_factory.mktemp("default-path")
    tok = tiny.make_tokenizer(VOCAB)
    model = tiny.make_model("llama", VOCAB, 10, scale=8.0, logits_dim=HEAD_ROWS)
    target = tiny.save(model, tok, folder / "target")
    draft = tiny.save(tiny.perturbed(model, 0.3, seed=3), tok, folder / "draft")
    settings = Settings(target=target, draft=draft + "@int4+head", prompt="w2 w0 w3", device="cpu",
                        ignore_eos=True)  # three tokens are counted: a run that stops at </s> has none
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SPECVIEW_COMPILE")  # the user's environment: --compile auto decides
        mp.delenv("SPECVIEW_AOT")  # and the compiled forward is built ahead of time
        mp.setenv("SPECVIEW_CACHE_DIR", str(user_cache()))
        # The probe's verdict (a timing on this machine, not under test) is the one a user of a faster compiled
        # forward gets: without it, a slow moment of the machine could put the models on transformers' forward.
        mp.setattr(forward_choice, "_probe_forward",
                   lambda lm, runner, *rest: forward_choice.Probe({"compiled": 1.0, "eager": 10.0}, 7, True))
        # The one-row product's probe (a timing too) finds a tie, so the first candidate, the compiled reduce, is
        # the one built and sampled: the real probe builds every candidate's one-row functions to time them, the
        # most of a first session's builds, and its pick would change with the machine's load.
        mp.setattr(forward_choice, "_probe_one_row",
                   lambda runner, kinds, *rest: forward_choice.Probe(dict.fromkeys(kinds, 1.0), 1, None))
        # background=False: a machine that has settled the forward (every start but the first) installs it before
        # the first step, as here; the first start's build on a thread of its own would swap it in mid-sampling.
        opened = open_session(settings, background=False)
        yield opened
    for lm in (opened.target, opened.draft):
        llama.uninstall(lm.model)


def compiled_counts(session, monkeypatch) -> tuple[np.ndarray, int, int]:
    """The first three tokens after the prompt, SAMPLES times, through the session's Decoder, with transformers'
    forward of both models raising: every logit sampled came from the compiled forward."""
    for lm in (session.target, session.draft):
        def refuse(*args, spec=lm.spec, **kwargs):
            raise AssertionError(f"{spec}: transformers' forward ran while sampling on the default path")

        monkeypatch.setattr(lm.model, "forward", refuse)
    return decoder_counts(session.decoder(), VOCAB, session.prompt_ids)


def test_the_session_runs_both_models_compiled_ahead_of_time(session):
    assert session.draft.spec.endswith("@int4+head") and session.target.dtype == torch.float32
    for lm in (session.target, session.draft):
        assert session.forwards[lm.spec]["mode"] == "compiled", session.forwards[lm.spec]["why"]
        runner = llama.runner_for(lm.model)
        assert runner is not None and runner.backend == "aot"
    assert llama.runner_for(session.target.model).gemv == "reduce"  # the one-row probe's tie (the fixture)
    assert {p["dtype"] for p in session.forwards[session.target.spec]["pieces"].values()} == {"float32"}
    assert session.forwards[session.draft.spec]["pieces"]["head"]["dtype"] == "int4"  # `+head`: the head too
    chosen, default = session.settings, Settings()
    assert chosen.compile == "auto" and chosen.sampling == default.sampling
    assert (chosen.k, chosen.seed, chosen.draft_policy) == (default.k, default.seed, default.draft_policy)


def exact(session) -> np.ndarray:
    """The target's law by enumeration, on transformers' forward of the float32 target (which rebuilds the weights
    one copy released, cpu/forward/one_copy.py)."""
    law = exact_joint(session.target, session.settings.sampling, VOCAB, prompt=session.prompt_ids)
    assert law.sum() == pytest.approx(1.0, abs=1e-5)
    return law


def test_the_draft_differs_from_the_target_so_the_test_means_something(session):
    draft_law = exact_joint(session.draft, session.settings.sampling, VOCAB, prompt=session.prompt_ids)
    assert 0.5 * np.abs(exact(session) - draft_law).sum() > 0.1


def test_speculative_sampling_keeps_the_target_law_on_the_default_path(session, monkeypatch):
    law = exact(session)
    counts, drafted, rejected = compiled_counts(session, monkeypatch)
    assert drafted > SAMPLES and rejected > SAMPLES // 10, "the draft must propose, and be rejected, often"
    assert tv(counts, law) < tv_threshold(law), "the default path's output is not the target's law"


def test_an_accept_rule_that_keeps_every_draft_is_caught_on_the_default_path(session, monkeypatch):
    law = exact(session)
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    counts, _, _ = compiled_counts(session, monkeypatch)
    assert tv(counts, law) > tv_threshold(law)


def test_a_residual_that_is_the_target_law_is_caught_on_the_default_path(session, monkeypatch):
    law = exact(session)
    monkeypatch.setattr(accept_rule, "residual_distribution", lambda p, q: p)
    counts, _, _ = compiled_counts(session, monkeypatch)
    assert tv(counts, law) > tv_threshold(law)

