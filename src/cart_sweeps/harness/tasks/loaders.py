"""`custom_dataset` loaders of the shipped task files (a YAML's own `data_files` would be relative to the working
directory; `!function loaders.<name>` is resolved against the YAML's folder)."""

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
