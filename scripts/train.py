"""Thin wrapper around the Hydra app: ``python scripts/train.py [overrides]`` == ``python -m gptmini.training.app``."""

from gptmini.training.app import main

if __name__ == "__main__":
    main()
