"""Hugging Face weights in and out (``gptmini export|import``, ``gptmini.hf.cli``): GPT-2 (``gpt2``), Llama
(``llama``) and Qwen3 (``qwen3``) folders. ``load_hf_weights`` and ``load_hf_model`` read each, by the folder's
``model_type``."""

from gptmini.hf.common import HFWeightsError
from gptmini.hf.formats import load_hf_model, load_hf_weights
from gptmini.hf.gpt2 import save_hf_gpt2
from gptmini.hf.llama import save_hf_llama

__all__ = ["HFWeightsError", "load_hf_model", "load_hf_weights", "save_hf_gpt2", "save_hf_llama"]
