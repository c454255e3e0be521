"""The embedding model every WindVE instance runs: :mod:`hwgen.models.minilm` (moved there so that
the I-BERT MiniLM and ESPN use it without importing the WindVE service); this name stays for
existing imports."""

from ..models.minilm import (DIM, MAX_TOKENS, MiniLM, count_tokens, load_config,  # noqa: F401
                              load_tokenizer, model_dir)

__all__ = ["DIM", "MAX_TOKENS", "MiniLM", "count_tokens", "model_dir"]
