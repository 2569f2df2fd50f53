"""The one exception the data layer raises for problems a user can fix."""

from __future__ import annotations


class DataError(ValueError):
    """A user-fixable data problem; its message is one line naming the problem and the fix."""
