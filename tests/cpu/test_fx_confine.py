"""A background build's torch.fx trace cannot touch the session's module calls (issue 51 item 1).

inductor's C++ codegen traces with torch.fx's Tracer on the build's thread, and the tracer replaces
torch.nn.Module.__call__ for the whole process while it traces. Here the build's work is a real torch.fx trace that
stops inside the traced function (its patches in place) until the test lets it go: the overlap is forced, not raced.
Meanwhile the session decodes on transformers' forward on the main thread. With the patches confined
(specview/cpu/fx_confine.py, which builds.start installs) the decode gives the tokens it gives with no build; with
the tracer's own patcher it raises the NameError the issue saw."""

import threading

import pytest
import torch
from torch.fx import _symbolic_trace as fx_trace

import tiny
from specview.core.settings import SamplingConfig
from specview.cpu import builds, fast_path, forward_choice, fx_confine
from specview.engine.decoder import Decoder
from specview.models.loader import load_pair

PROMPT = [1, 5, 7]


@pytest.fixture(autouse=True)
def stock_kernels(monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # no kernel probes or builds: the module calls are the point


@pytest.fixture(scope="module")
def pair(tiny_dir):
    return load_pair(*tiny.save_noisy_pair(tiny_dir, "fx-confine", "llama", 16, 5, scale=3.0, noise=0.3,
                                           noise_seed=1), torch.device("cpu"))


class Blocking(torch.nn.Module):
    """A module whose traced forward calls a submodule, then waits for the test with the tracer's patches on."""

    def __init__(self, inside: threading.Event, release: threading.Event):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.inside, self.release = inside, release

    def forward(self, x):
        y = self.inner(x)
        self.inside.set()
        assert self.release.wait(60), "the test never let the trace go"
        return y


def greedy(target, draft) -> list[int]:
    run = Decoder(target, draft, SamplingConfig(temperature=0), k=3, seed=0, ignore_eos=True).start(PROMPT, 10)
    while not run.done:
        run.step()
    return run.generated


def traced_build(target) -> tuple[threading.Event, threading.Event, dict]:
    """builds.start with a build whose work is a torch.fx trace held open: (inside, release, its result)."""
    inside, release, out = threading.Event(), threading.Event(), {}

    def work(progress):
        progress("tracing (held open by the test)")
        out["graph"] = fx_trace.Tracer().trace(Blocking(inside, release))
        return fast_path.ForwardChoice("eager", "a stand-in build that only traces"), None

    builds.start(target.model, target.spec, work, one_copy=False)
    assert inside.wait(60), "the build never reached its trace"
    return inside, release, out


def finish(target, release) -> None:
    release.set()
    assert builds.wait(target.model, timeout=60)
    forward_choice.take_ready(target.model)


def test_a_trace_on_the_build_thread_leaves_the_session_decoding(pair):
    target, draft = pair
    quiet = greedy(target, draft)
    original = torch.nn.Module.__call__
    _, release, out = traced_build(target)
    try:
        assert torch.nn.Module.__call__ is not original  # the tracer's stand-in is in place, process-wide
        during = greedy(target, draft)
    finally:
        finish(target, release)
    assert torch.nn.Module.__call__ is original
    assert during == quiet
    # and the trace on its own thread still saw its module calls: the submodule is a call_module node
    assert [n.target for n in out["graph"].nodes if n.op == "call_module"] == ["inner"]


def test_without_the_confinement_the_session_raises_as_the_issue_saw(pair, monkeypatch):
    """The power of the test above: the tracer's own patcher (torch's, not confined) breaks the same decode."""
    target, draft = pair
    fx_confine.install()
    monkeypatch.setattr(fx_trace, "_Patcher", fx_trace._Patcher.__mro__[1])
    monkeypatch.setattr(fx_confine, "install", lambda: True)  # builds.start would confine it again
    _, release, _ = traced_build(target)
    try:
        with pytest.raises(NameError, match="not installed as a submodule"):
            greedy(target, draft)
    finally:
        finish(target, release)
