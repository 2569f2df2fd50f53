"""Reading a user's stage file safely, before Hydra loads it: one line naming the file, where and the fix, never a
hang (a FIFO) or minutes and gigabytes (a "billion laughs" of aliases, each of which OmegaConf copies).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from cart_sweeps.config import ConfigError

MAX_BYTES = 256 * 1024  # far above any stage a person writes (the shipped ones are under 1 KB)
MAX_VALUES = 100_000  # values once every alias is copied, as OmegaConf loads them
PLAIN = "a stage file is a plain .yaml file"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # LibYAML's parser where installed: the same grammar


def _refuse(path: Path, where: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{path}: {where}{problem}; {fix}")


def _at(mark: yaml.Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""


def _text(path: Path) -> str:
    """The file's text: a regular file of at most MAX_BYTES of UTF-8 (a FIFO would block the reader forever)."""
    not_regular = _refuse(path, "", "not a regular file (a FIFO, device or folder)", PLAIN)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never opened: opening a FIFO waits for a writer
            raise not_regular
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:  # a FIFO put there since: no wait
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise not_regular
            data = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise _refuse(path, "", f"cannot be read ({err.strerror})", "check its permissions") from err
    if len(data) > MAX_BYTES:
        raise _refuse(path, "", f"over {MAX_BYTES // 1024} KB", "a stage file is a page of settings: shorten it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise _refuse(
            path, f"line {line}, column {column}: ", f"byte {data[err.start]:#x} is not UTF-8 text", "save it as UTF-8"
        ) from err


def _values(node: yaml.Node, path: Path) -> int:
    """The values `node` holds with every alias copied: refused past MAX_VALUES and for an alias inside itself."""
    counted: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(n: yaml.Node) -> int:
        if id(n) in counted:
            return counted[id(n)]
        if id(n) in open_nodes:
            raise _refuse(path, _at(n.start_mark), "an alias inside its own anchor", "write the values out")
        open_nodes.add(id(n))
        children = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else n.value
        total = 1 + (sum(count(c) for c in children) if isinstance(n, yaml.CollectionNode) else 0)
        open_nodes.discard(id(n))
        if total > MAX_VALUES:
            raise _refuse(
                path, _at(n.start_mark), f"its aliases expand to over {MAX_VALUES:,} values", "write the values out"
            )
        counted[id(n)] = total
        return total

    return count(node)


def parse(path: Path) -> yaml.Node | None:
    """The file's YAML, parsed but not built, its size once expanded checked; None when empty."""
    text = _text(path)
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as err:
        context = f" ({err.context})" if err.context else ""
        raise _refuse(
            path, _at(err.problem_mark or err.context_mark), f"{err.problem}{context}", "fix the YAML there"
        ) from err
    except yaml.YAMLError as err:
        raise _refuse(path, "", str(err).splitlines()[0], "fix the YAML") from err
    if node is not None:
        _values(node, path)
    return node


def check(path: Path) -> None:
    """Refuse, in one line, a stage file Hydra could not load quickly and safely: before Hydra reads it."""
    node = parse(path)
    if node is not None and not isinstance(node, yaml.MappingNode):
        raise _refuse(path, "", "a stage file is a mapping", "write name:, grid:, recipe:, ... at the top level")


def top_level(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of the top-level `keys` the file sets (role:, name:), built alone."""
    node = parse(path)
    if not isinstance(node, yaml.MappingNode):
        return {}
    builder = yaml.constructor.SafeConstructor()
    return {
        key.value: builder.construct_object(value, deep=True)
        for key, value in node.value
        if isinstance(key, yaml.ScalarNode) and key.value in keys
    }


def load(path: Path) -> Any:
    """The whole file, built (checked first)."""
    node = parse(path)
    return None if node is None else yaml.constructor.SafeConstructor().construct_document(node)
