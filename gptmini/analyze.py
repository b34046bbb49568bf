"""``python -m gptmini.analyze``: see ``gptmini.inference.analyze``."""

import sys

from gptmini.inference.analyze import main

if __name__ == "__main__":
    sys.exit(main())
