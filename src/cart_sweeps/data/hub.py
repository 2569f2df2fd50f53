"""Whether the Hugging Face hub is switched off for this process, read without importing `datasets`
(1.6 s): a driver's preflight asks it before anything is launched."""

from __future__ import annotations

import os


def hub_offline() -> bool:
    """Whether the HF offline variables are set: then a hub fetch fails at once instead of retrying."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
