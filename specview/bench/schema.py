"""The bench file's identity: its schema name (its home is documents.py, with the other files') and the order
methods are shown in."""

from specview.documents import BENCH_SCHEMA  # noqa: F401 - bench's modules take it from here

METHOD_ORDER = ("autoregressive", "speculative", "draft_autoregressive", "hf_generate", "hf_assisted",
                "hf_prompt_lookup")  # then speculative:<spec> for each further drafter
