"""Benchmarks: ``python scripts/bench.py [--only attention,train,generate,data] [--quick] [--out results/]``.

Tables are printed and written to ``results/<name>.md|csv`` (plus ``attention.png`` and ``summary.md``);
see the ``benchmarks`` package for what is measured and how. Same as ``python -m benchmarks``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root holds `benchmarks/`

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
