"""The bench file's identity: its schema name and the order methods are shown in."""

BENCH_SCHEMA = "specview.bench/1"
METHOD_ORDER = ("autoregressive", "speculative", "draft_autoregressive", "hf_generate", "hf_assisted",
                "hf_prompt_lookup")  # then speculative:<spec> for each further drafter
