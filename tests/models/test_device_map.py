"""--device-map: a target whose layers sit in several places (accelerate) decodes exactly as the same model
in one piece: here split between the CPU and disk offload, the only second "device" a CPU machine has."""

import json

import pytest
import torch

import tiny
from specview.core.errors import SpecviewError
from specview.core.settings import SamplingConfig
from specview.engine.decoder import Decoder
from specview.models.loader import load_model
from specview.models.placement import parse_max_memory, placement

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def llama_path(tiny_dir):
    return tiny.save(tiny.make_model("llama", 16, 7, layers=3, scale=4.0), tiny.make_tokenizer(16),
                     tiny_dir / "llama-3-layers")


def greedy_tokens(target, draft, k: int) -> list[int]:
    decoder = Decoder(target, draft, SamplingConfig(temperature=0.0), k=k, ignore_eos=True)
    run = decoder.start([4, 5, 6], 24)
    while not run.done:
        run.step()
    return run.generated


@pytest.mark.parametrize("where", ["disk", "cpu"])
def test_a_split_target_gives_the_tokens_of_the_whole_model(llama_path, tmp_path, where):
    mapping = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": where,
               "model.layers.2": where, "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": where}
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps(mapping))
    whole = load_model(llama_path, CPU)
    split = load_model(llama_path, CPU, device_map=str(map_file))
    assert split.device == CPU
    if where == "disk":  # really offloaded: those weights are not in memory until their forward
        assert split.model.hf_device_map == mapping
        run = Decoder(split, None, SamplingConfig(temperature=0.0)).start([4, 5], 2)
        assert run.step().memory_mb["devices"] == {"cpu": None, "disk": None}  # each device, for the panel
        assert split.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    draft = load_model(llama_path + "@bfloat16", CPU)
    for k in (1, 3):
        assert greedy_tokens(split, draft, k) == greedy_tokens(whole, draft, k)
    assert greedy_tokens(split, None, 1) == greedy_tokens(whole, None, 1)  # autoregressive too


def test_auto_map_loads_and_placement_errors_are_one_line(llama_path, tmp_path):
    lm = load_model(llama_path, CPU, device_map="auto", max_memory="cpu=1GiB")
    assert lm.device == CPU and set(getattr(lm.model, "hf_device_map", {"": "cpu"}).values()) == {"cpu"}
    assert parse_max_memory("0=20GiB, cpu=60GiB") == {0: "20GiB", "cpu": "60GiB"}
    with pytest.raises(SpecviewError, match="not DEVICE=SIZE"):
        placement("auto", "20GiB")
    with pytest.raises(SpecviewError, match="cannot read"):
        placement(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SpecviewError, match="must map module names"):
        placement(str(bad))
    with pytest.raises(SpecviewError, match="without a dtype suffix"):
        load_model(llama_path + "@bfloat16", CPU, device_map="auto")
