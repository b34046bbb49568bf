"""Data: tokenizers, corpora, preparation into token files, and the windows a DataModule serves."""
