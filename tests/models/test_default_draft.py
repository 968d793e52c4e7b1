"""The default draft per device (issue 43): `@int4+head` has no kernel on CUDA below compute capability 8.0 nor on MPS
before macOS 14, so the defaults (run's, bench's, eval's) draft with the half-precision copy there, and an @int4 spec
given on such a device fails in one line before anything loads. MPS from macOS 14 runs an @int4 spec given to it
(torch's MPS int4 ops take CUDA's packing: test_int4_mps.py), while its default stays the half-precision copy until
its kernel has run on a Mac. No GPU or Mac here: the device is named, never used."""

import pytest
import torch

import specview.session as session_module
from specview.core.errors import SpecviewError
from specview.core.settings import (
    BENCH_DRAFTS,
    DEFAULT_DRAFT,
    EVAL_DRAFTS,
    NO_INT4_DRAFT,
    Settings,
    draft_for_device,
)
from specview.models.int4 import device_problem


class Loaded(Exception):
    """The stub loader's: a model load was reached."""


@pytest.fixture
def on_device(monkeypatch):
    """open_session on a named device, its loader replaced by one that records the spec and stops."""
    loads = []

    def use(name: str, capability=(8, 0), macos=(14, 0)):
        monkeypatch.setattr(session_module, "resolve_device", lambda wanted: torch.device(name))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos >= (major, minor))

        def load(spec, *args, **kwargs):
            loads.append(spec)
            raise Loaded(spec)

        monkeypatch.setattr(session_module, "load_model", load)
        return loads

    return use


@pytest.mark.parametrize("device, capability, macos", [("mps", None, (13, 5)), ("cuda", (7, 5), None)])
def test_an_int4_draft_is_refused_before_any_load(on_device, device, capability, macos):
    loads = on_device(device, capability, macos)
    with pytest.raises(SpecviewError, match=r"^--draft some/model@int4;tree:b=2,d=3: @int4 has no kernel for device"):
        session_module.open_session(Settings(draft="some/model@int4;tree:b=2,d=3"))
    assert loads == []


def test_an_int4_draft_passes_the_spec_check_on_mps_from_macos_14(on_device):
    """torch's MPS int4 ops take the packing CUDA's do (test_int4_mps.py): an @int4 spec given there is loaded."""
    loads = on_device("mps", macos=(14, 0))
    settings = Settings(draft="some/model@int4")
    with pytest.raises(Loaded):
        session_module.open_session(settings)
    assert settings.draft == "some/model@int4" and loads == [settings.target]


@pytest.mark.parametrize("device, capability, macos", [("mps", None, (13, 0)), ("mps", None, (15, 1)),
                                                       ("cuda", (7, 0), None)])
def test_the_default_draft_is_chosen_for_the_device(on_device, device, capability, macos):
    loads = on_device(device, capability, macos)
    settings = Settings()
    with pytest.raises(Loaded):
        session_module.open_session(settings)
    assert settings.draft == NO_INT4_DRAFT and loads == [settings.target]


def test_the_default_stays_int4_where_it_runs(on_device):
    on_device("cuda", (8, 6))
    settings = Settings()
    with pytest.raises(Loaded):
        session_module.open_session(settings)
    assert settings.draft == DEFAULT_DRAFT
    assert device_problem(torch.device("cpu")) is None


def test_the_default_lists():
    assert draft_for_device(BENCH_DRAFTS, False) == NO_INT4_DRAFT  # two int4 copies: one float16 draft, once
    assert draft_for_device(EVAL_DRAFTS, False) == NO_INT4_DRAFT + ",ngram"
    assert draft_for_device("other@int4", False) == "other@int4"  # given: refused by the session, not replaced
    assert draft_for_device(DEFAULT_DRAFT, True) == DEFAULT_DRAFT
