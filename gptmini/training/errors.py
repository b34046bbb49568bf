"""The error of a run that cannot start as configured."""

from __future__ import annotations


class RunError(ValueError):
    """A run cannot start as configured; the message says why and what to change."""
