"""The analysis's one error type."""


class AnalysisError(ValueError):
    """A problem with the input the user can fix; shown as one line, not a traceback."""
