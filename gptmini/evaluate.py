"""``python -m gptmini.evaluate``: see ``gptmini.inference.evaluate``."""

import sys

from gptmini.inference.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
