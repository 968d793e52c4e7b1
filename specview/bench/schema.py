"""The bench file's identity: its schema name (its home is core/file_schemas.py, with the other files'), the order
methods are shown in, and the peers (no torch here: `specview bench --help` and `report` stay light)."""

from specview.core.file_schemas import BENCH_SCHEMA  # noqa: F401 - bench's modules take it from here

METHOD_ORDER = ("autoregressive", "speculative", "draft_autoregressive", "hf_generate", "hf_assisted",
                "hf_prompt_lookup", "llamacpp_generate", "llamacpp_prompt_lookup", "llama_server_generate",
                "llama_server_speculative", "vllm_generate", "vllm_speculative")  # then speculative:<spec> for each
# further drafter
# peer methods whose work depends on K
DRAFTING_PEERS = ("hf_assisted", "hf_prompt_lookup", "llamacpp_prompt_lookup", "llama_server_speculative",
                  "vllm_speculative")
PEER_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "llamacpp_generate", "llamacpp_prompt_lookup",
                "llama_server_generate", "llama_server_speculative", "vllm_generate", "vllm_speculative")
# hf = transformers' generate(), assisted generation and prompt lookup; llamacpp = llama-cpp-python on the
# target's GGUF file, plain and with its prompt lookup; llama-server[:TYPE] = llama.cpp's server on that file,
# plain and with its speculative TYPE (bench/llama_server.py); vllm[:METHOD] = vLLM's server on the target's folder,
# plain and with its speculative METHOD (bench/vllm_peer.py)
PEERS = ("hf", "llamacpp", "llama-server", "vllm")
TYPED_PEERS = ("llama-server", "vllm")  # the peers that take :TYPE


def peer_names(peer: str | None) -> list[str]:
    """--peer's value ('hf', 'llamacpp', 'hf,llama-server:ngram-mod' or None) -> the peers, in the order given."""
    return [p for p in (peer or "").split(",") if p]


def peer_base(name: str) -> str:
    """'llama-server:ngram-mod' -> 'llama-server'."""
    return name.partition(":")[0]
