"""Tokenize a corpus: ``python scripts/prepare_data.py --source shakespeare --tokenizer gpt2``."""

import sys

from gptmini.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
