"""Hugging Face weights in and out (``python -m gptmini.hf export|import``)."""

from gptmini.hf.gpt2 import HFWeightsError, load_hf_gpt2, load_hf_weights, save_hf_gpt2

__all__ = ["HFWeightsError", "load_hf_gpt2", "load_hf_weights", "save_hf_gpt2"]
