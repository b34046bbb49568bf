"""Thin wrapper: see gptmini/inference/export_attention.py."""

import sys

from gptmini.inference.export_attention import main

if __name__ == "__main__":
    sys.exit(main())
