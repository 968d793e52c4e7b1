"""The bench file's identity: its schema name, the order methods are shown in, and the peers (no torch
here: `specview bench --help` and `report` of a bench file stay light)."""

BENCH_SCHEMA = "specview.bench/1"
METHOD_ORDER = ("autoregressive", "speculative", "draft_autoregressive", "hf_generate", "hf_assisted",
                "hf_prompt_lookup", "llamacpp_generate",
                "llamacpp_prompt_lookup")  # then speculative:<spec> for each further drafter
DRAFTING_PEERS = ("hf_assisted", "hf_prompt_lookup", "llamacpp_prompt_lookup")  # peer methods whose work depends on K
PEER_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "llamacpp_generate", "llamacpp_prompt_lookup")
# hf = transformers' generate(), assisted generation and prompt lookup; llamacpp = llama-cpp-python on the
# target's GGUF file, plain and with its prompt lookup
PEERS = ("hf", "llamacpp")


def peer_names(peer: str | None) -> list[str]:
    """--peer's value ('hf', 'llamacpp', 'hf,llamacpp' or None) -> the peers, in the order given."""
    return [p for p in (peer or "").split(",") if p]
