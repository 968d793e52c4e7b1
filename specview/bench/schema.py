"""The bench file's identity: its schema name (its home is core/file_schemas.py, with the other files'), the order
methods are shown in, and the peers (no torch here: `specview bench --help` and `report` stay light)."""

from specview.core.file_schemas import BENCH_SCHEMA  # noqa: F401 - bench's modules take it from here

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
