"""Attention as the book teaches it, from a weightless dot product to multi-head attention, in reading order:

- ``textbook``: chapter 3 of Raschka's "Build a Large Language Model (From Scratch)" line for line — simplified
  self-attention, ``SelfAttention_v1`` (``nn.Parameter``), ``SelfAttention_v2`` (``nn.Linear``),
  ``CausalAttention``, ``MultiHeadAttentionWrapper`` (stacked heads), ``MultiHeadAttention`` (weight splits) —
  and the two multi-head classes as language-model attention (registry names ``wrapper`` and ``mha``);
- ``einsum``: general Q/K/V attention over explicit per-head weight tensors, as index contractions (``einsum``);
- ``additive``: Bahdanau's additive scores (``bahdanau``), and a causal multi-head self-attention on them
  (``additive``).

Each registers itself in ``gptmini.attention.registry``; the non-causal ones (``simplified``, ``v1``, ``v2``,
``bahdanau``) are there to be looked up and tested, not to drive the language model.
"""
