"""`python -m cart_sweeps.data.prepare data=<recipe> [overrides]` (USAGE)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.data.manifest import MANIFEST
from cart_sweeps.data.prepare import prepare

USAGE = """\
usage: python -m cart_sweeps.data.prepare [data=<recipe>] [override ...]

Tokenize a data recipe once into <data.cache_dir>/<recipe>-<hash>/: train.bin and val_<set>.bin
(uint16 token ids), tokenizer.json and manifest.json. Runs do this themselves when the bins are missing.

recipes (conf/data/):
  embedded    the offline corpus shipped in the package (Shakespeare, KJV Bible, Austen), BPE 4096
  paper_mix   the paper's ~1B-token TinyStories/Wikipedia/FineWeb-Edu mix from the hub, Llama-2 tokenizer

examples:
  python -m cart_sweeps.data.prepare data=embedded
  python -m cart_sweeps.data.prepare data=paper_mix data.cache_dir=/scratch/cart
  python -m cart_sweeps.data.prepare data=embedded data.tokenizer.vocab_size=8192"""


def _main(args: list[str]) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    folder = prepare(compose_config(args).data)  # a DataError is a ConfigError: run_cli's one line, exit 2
    manifest = json.loads((folder / MANIFEST).read_text())
    val = ", ".join(f"{k} {v['tokens']:,}" for k, v in manifest["validation"].items())
    print(
        f"{folder}: train {manifest['train']['tokens']:,} tokens {manifest['train']['tokens_per_source']}; "
        f"val {val}; vocab {manifest['tokenizer']['vocab_size']:,}"
    )
    return folder


def main(argv: list[str] | None = None) -> None:
    run_cli(_main, USAGE, argv)


if __name__ == "__main__":
    main()
