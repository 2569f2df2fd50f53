"""OmegaConf's multi-line complaint about what a config file holds ("Key 'reicpe' not in 'StageConfig'"), read
from its text (Hydra passes on no more of the error), as the one line a user reads: the file, the key, the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from cart_sweeps import config

_UNKNOWN = re.compile(r"^Key '([^']+)' not in '(\w+)'")
_ONE_VALUE = re.compile(r"^Value (.+) \(\w+\) is incompatible with type hint '[\w.]*List\b")
_MAPPING = re.compile(r"^'DictConfig' is incompatible with type hint '[\w.]*List\b")
_FULL_KEY = re.compile(r"^\s*full_key: (\S+)", re.MULTILINE)


def file_mistake(text: str, where: str, package: str = "") -> str:
    """One line for OmegaConf's error `text` about the file `where`, whose content sits at `package` of the config."""
    message = next((line.strip() for line in text.splitlines() if line.strip()), text)
    full = _FULL_KEY.search(text)
    key = full.group(1).removeprefix(f"{package}.") if full else None
    if unknown := _UNKNOWN.match(message):
        name, schema = unknown.groups()
        parent = key.rpartition(".")[0] if key else ""
        found = getattr(config, schema, None)  # a schema dataclass of cart_sweeps.config, or another type
        known = [f.name for f in dataclasses.fields(found)] if dataclasses.is_dataclass(found) else []
        if close := difflib.get_close_matches(name, known, n=1):
            fix = f"did you mean {'.'.join(filter(None, [parent, close[0]]))}?"
        else:
            fix = f"the settings there: {', '.join(known)}" if known else "check its spelling"
        return f"{where}: {key or name} is no setting; {fix}"
    if key and (one := _ONE_VALUE.match(message)):
        return f"{where}: {key}: {one.group(1)} is one value where a list is wanted: write [{one.group(1)}]"
    if key and _MAPPING.match(message):
        axis = " (a grid axis is one dotted key: model.n_loops: [2, 4])" if key.startswith("grid.") else ""
        return f"{where}: {key}: a mapping where a list is wanted{axis}"
    return f"{where}: {key}: {message}" if key else f"{where}: {message}"
