"""The data layer's one error type, in a module of its own: every data module raises it without importing the
others, and the training app finds it in ``sys.modules`` under a single name."""


class DataError(ValueError):
    """A corpus or a prepared data folder is missing, empty, malformed or too small."""
