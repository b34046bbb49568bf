"""Thin wrapper: see gptmini/inference/sample.py."""

import sys

from gptmini.inference.sample import main

if __name__ == "__main__":
    sys.exit(main())
