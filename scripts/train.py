"""Thin wrapper around the Hydra app: ``python scripts/train.py [overrides]`` == ``python -m gptmini.training.run.app``."""

from gptmini.training.run.app import main

if __name__ == "__main__":
    main()
