"""`custom_dataset` loaders of the shipped task files: paths next to this file, wherever the package lives.

lm-eval resolves a task YAML's `!function loaders.<name>` against the YAML's folder, whereas a YAML's own
`data_files` would be relative to the working directory; hence these two one-line loaders.
"""

from __future__ import annotations

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _load(task: str) -> datasets.DatasetDict:
    files = {split: str(HERE / f"{task}-{split}.jsonl.gz") for split in ("train", "test")}
    return datasets.load_dataset("json", data_files=files)


def lastword(**_metadata) -> datasets.DatasetDict:
    return _load("lastword")


def nextpassage(**_metadata) -> datasets.DatasetDict:
    return _load("nextpassage")
