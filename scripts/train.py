"""Thin wrapper around the Hydra app: ``python scripts/train.py [overrides]`` == ``python -m gptmini.train``."""

from gptmini.train import main

if __name__ == "__main__":
    main()
