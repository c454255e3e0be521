"""Quality against human judgements: the Lee corpus' 50 documents and their 50x50 similarities.

gensim ships the mean similarity that human raters gave each pair of the 50 Lee news documents
(``similarities0-1.txt``). For each pair the models' similarity is

* **MaxSim** of the token embeddings (the re-ranker's score), normalised by the query document's
  token count and averaged over both directions (MaxSim is asymmetric);
* **cosine** of the pooled sentence embeddings (the single-vector candidate generator's score).

Reported: Spearman's rank correlation with the human scores over the 1,225 pairs, and nDCG@10 of
ranking the other 49 documents for each document with the human similarity as the gain.
"""

import numpy as np

from .corpus import lee_documents, lee_similarities
from .search import maxsim

__all__ = ["lee_quality", "ndcg_at"]


def ndcg_at(model, human, k=10):
    """Mean nDCG@k of ranking each row's other documents by ``model``, gains ``human``."""
    n = len(model)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    scores = []
    for i in range(n):
        others = np.array([j for j in range(n) if j != i])
        order = others[np.argsort(-model[i, others], kind="stable")][:k]
        ideal = np.sort(human[i, others])[::-1][:k]
        scores.append(float((human[i, order] * discounts).sum() / (ideal * discounts).sum()))
    return float(np.mean(scores))


def _maxsim_matrix(tokens):
    n = len(tokens)
    m = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            m[i, j] = maxsim(tokens[i], tokens[j]) / tokens[i].shape[0]
    return (m + m.T) / 2


def lee_quality(encoder):
    """Spearman and nDCG@10 of MaxSim (the encoder's projection) and of pooled cosine."""
    from scipy.stats import spearmanr
    docs = lee_documents()
    human = lee_similarities()
    pooled, tokens = encoder.encode(docs)
    pairs = np.triu_indices(len(docs), 1)
    models = {f"maxsim_dim{encoder.dim}": _maxsim_matrix(tokens),
              "pooled_cosine": pooled @ pooled.T}
    out = {"documents": len(docs), "pairs": int(len(pairs[0]))}
    for name, sim in models.items():
        rho = spearmanr(sim[pairs], human[pairs]).statistic
        out[name] = {"spearman": round(float(rho), 4), "ndcg10": round(ndcg_at(sim, human), 4)}
    return out
