"""What the analysis refuses: input the user can fix (what it leaves out is a runset.LeftOut, listed)."""


class AnalysisError(ValueError):
    """A problem with the input the user can fix; shown as one line, not a traceback."""
