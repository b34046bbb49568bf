"""Benchmarks: ``python scripts/bench.py [--only attention,train,generate,data] [--quick] [--out results/]``.

Tables are printed and written to ``results/<name>.md|csv`` (plus ``attention.png`` and ``summary.md``);
see ``gptmini.bench`` for what is measured and how.
"""

import sys

from gptmini.bench import main

if __name__ == "__main__":
    sys.exit(main())
