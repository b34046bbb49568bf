"""Benchmarks behind ``make bench``: attention, training, generation and data, by subject; ``cli`` runs them.

Each benchmark returns rows (dicts); ``common.write_table`` prints them as Markdown and saves ``<name>.md`` and
``<name>.csv`` atomically under the output folder; ``summary.write_summary`` checks the key ratios against
their targets and records the machine. Nothing here asserts a time: the numbers are reported.

Timing method everywhere: ``time.perf_counter`` around the work (with ``torch.cuda.synchronize`` on a GPU),
after warmup, and the median of the repeats. The machine may be shared, so the load average is recorded.
Not part of the installed package: run from the repository (``make bench`` or ``python -m benchmarks``).
"""
