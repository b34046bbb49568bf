"""Data: ``tokenizers``, ``corpora`` (where text comes from), ``prepare`` (token files + metadata),
``windows`` (datasets and samplers, torch) and ``datamodule`` (the Lightning DataModule, the only Lightning
import). Nothing is imported here, so importing ``gptmini.data.tokenizers`` stays cheap."""
