"""ColBERT-style token embeddings from all-MiniLM-L6-v2, and its pooled vector for the ANN index.

This is a late-interaction pipeline on an *untuned* encoder: MiniLM was trained for one pooled
sentence vector, not for MaxSim over its token states (ColBERT and ColBERTer fine-tune for that).
Its token vectors still carry the context of each token, which is what MaxSim compares.

Per text:

* **pooled**: the model's sentence embedding (mean pooling + L2 normalisation, 384 float32) —
  the single vector that the IVF candidate generator indexes;
* **tokens**: the encoder's last hidden state of every real token ([CLS] and [SEP] included),
  centred by the corpus mean, projected onto the corpus' top ``dim`` principal directions
  (``dim`` 32 or 64 like ColBERTer's BOW vectors; 384 keeps the full width, centred but
  unprojected), L2-normalised per token and stored as float16. The mean and the projection are
  fitted once at index time (:meth:`TokenEncoder.fit`) on a sample of the corpus' tokens and saved
  with the index, so queries are projected the same way.

Queries keep at most :data:`QUERY_TOKENS` tokens (ColBERT's query length, and what the MaxSim unit
holds on chip).
"""

import numpy as np

from ...errors import ConfigError
from ...models.minilm import DIM, MiniLM

__all__ = ["QUERY_TOKENS", "TokenEncoder", "DIMS"]

#: Most query tokens kept (ColBERT's query length; the ``maxsim`` unit's ``q_tokens`` limit).
QUERY_TOKENS = 32
#: Token widths the encoder supports.
DIMS = (16, 32, 64, 128, DIM)


def _normalise(x):
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class TokenEncoder:
    """MiniLM plus the fitted token projection.

    ``mean`` (384,) and ``components`` (384, dim) float32 define the projection; both None until
    :meth:`fit` (or given, when loading an index).
    """

    def __init__(self, dim=32, threads=None, mean=None, components=None, model=None):
        if dim not in DIMS:
            raise ConfigError("dim", f"choose one of {', '.join(map(str, DIMS))}", value=dim)
        self.dim = dim
        self.model = model if model is not None else MiniLM(threads=threads)
        self.mean = None if mean is None else np.asarray(mean, np.float32)
        self.components = None if components is None else np.asarray(components, np.float32)

    def fit(self, texts):
        """Fit the centring mean and the ``dim`` principal directions on ``texts``' tokens."""
        texts, tokens = list(texts), []
        for start in range(0, len(texts), 32):          # batches: padding to the longest text
            tokens += self.model.encode_tokens(texts[start:start + 32])[1]
        sample = np.concatenate(tokens).astype(np.float64)
        self.mean = sample.mean(axis=0).astype(np.float32)
        if self.dim == DIM:
            self.components = np.eye(DIM, dtype=np.float32)
        else:
            if sample.shape[0] < self.dim:
                raise ConfigError("corpus", f"{sample.shape[0]} tokens are too few to fit "
                                  f"{self.dim} "
                                 "directions: give a larger corpus")
            centred = sample - self.mean
            # principal directions: eigenvectors of the 384x384 scatter matrix, largest first
            values, vectors = np.linalg.eigh(centred.T @ centred)
            order = np.argsort(values)[::-1][:self.dim]
            top = vectors[:, order]
            top *= np.where(top[np.abs(top).argmax(axis=0), range(self.dim)] < 0, -1.0, 1.0)
            self.components = np.ascontiguousarray(top, dtype=np.float32)
        return self

    def project(self, hidden):
        """float16 ``(n, dim)`` token embeddings of one text's hidden states ``(n, 384)``."""
        if self.components is None:
            raise RuntimeError("the projection is not fitted: call fit() first")
        return _normalise((hidden - self.mean) @ self.components).astype(np.float16)

    def encode(self, texts):
        """``(pooled float32 (n, 384), [float16 (tokens_i, dim)])`` of documents ``texts``
        (encoded in batches of 32)."""
        texts, pooled, tokens = list(texts), [], []
        for start in range(0, len(texts), 32):
            p, hidden = self.model.encode_tokens(texts[start:start + 32])
            pooled.append(p)
            tokens += [self.project(h) for h in hidden]
        if not pooled:
            return np.zeros((0, DIM), np.float32), []
        return np.concatenate(pooled), tokens

    def encode_query(self, text):
        """``(pooled float32 (384,), float16 (<= QUERY_TOKENS, dim))`` of one query."""
        pooled, hidden = self.model.encode_tokens([text])
        return pooled[0], self.project(hidden[0][:QUERY_TOKENS])
