"""The one exception the data layer raises for problems a user can fix."""

from __future__ import annotations

from cart_sweeps.config import ConfigError


class DataError(ConfigError):
    """A user-fixable data problem: a ConfigError, so a run that meets one is rejected, not retried."""
