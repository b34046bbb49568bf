"""gptmini: a small GPT training pipeline centred on causal multi-head attention."""

__version__ = "0.1.0"
