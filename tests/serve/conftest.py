"""The served pair of the serve tests: the session's tiny GPT-2 pair, greedy, a short default length."""

import pytest

from specview.core.settings import Settings


@pytest.fixture
def settings(gpt2_paths, tmp_path):
    return Settings(target=gpt2_paths[0], draft=gpt2_paths[1], max_new_tokens=8, k=3, temperature=0.0,
                    threads=1, profile_dir=str(tmp_path / "profiles"))
