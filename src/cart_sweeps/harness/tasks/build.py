"""Rebuild the shipped offline benchmark tasks from the embedded corpus's validation text (public domain).

Two tasks in the paper's two task formats, so the harness, the study and the tests run offline at the
tiny scale:

- cart_lastword (like lambada_openai): a passage of PASSAGE_WORDS words; predict its last word (acc, perplexity).
- cart_nextpassage (like hellaswag): a passage of CONTEXT_WORDS words and four endings of ENDING_WORDS
  words, one the true continuation, three taken from other passages of the same source (acc, acc_norm).

Only the validation documents are read (the models never trained on them); every FEWSHOT_EVERY-th forms the
few-shot pool (split `train`). Byte-reproducible (fixed seed, gzip mtime 0):

    python src/cart_sweeps/harness/tasks/build.py
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
EMBEDDED = HERE.parents[1] / "data" / "embedded"
SOURCES = ("shakespeare", "bible", "austen")
FEWSHOT_EVERY = 4
PER_SOURCE = {"test": 100, "train": 10}  # examples per source and split: 300 test questions, 30 few-shot
PASSAGE_WORDS = 48  # about 65 tokens of the embedded BPE: inside the tiny model's 128-token context
CONTEXT_WORDS = 40
ENDING_WORDS = 16
N_CHOICES = 4
SEED = 0


def documents(source: str) -> list[str]:
    """The source's validation documents, whitespace flattened to single spaces (as LAMBADA's text is)."""
    with gzip.open(EMBEDDED / f"{source}-val.jsonl.gz", "rt", encoding="utf-8") as f:
        return [" ".join(json.loads(line)["text"].split()) for line in f]


def windows(words: list[str], size: int) -> Iterator[list[str]]:
    """Disjoint runs of `size` words, in order."""
    for start in range(0, len(words) - size + 1, size):
        yield words[start : start + size]


def lastword_examples(docs: list[str]) -> list[dict]:
    """Passages whose last word (trailing punctuation dropped) is alphabetic and at least 3 letters."""
    out = []
    for doc in docs:
        for passage in windows(doc.split(" "), PASSAGE_WORDS):
            target = passage[-1].rstrip(".,;:!?'\"")
            if target.isalpha() and len(target) >= 3:
                out.append({"text": " ".join([*passage[:-1], target])})
    return out


def nextpassage_examples(docs: list[str], rng: random.Random) -> list[dict]:
    """A context, its true ending and N_CHOICES - 1 endings of other passages of the same source, shuffled."""
    pairs = [
        (" ".join(run[:CONTEXT_WORDS]), " ".join(run[CONTEXT_WORDS:]))
        for doc in docs
        for run in windows(doc.split(" "), CONTEXT_WORDS + ENDING_WORDS)
    ]
    out = []
    for i, (context, ending) in enumerate(pairs):
        others = rng.sample([p[1] for j, p in enumerate(pairs) if j != i], N_CHOICES - 1)
        choices = [ending, *others]
        rng.shuffle(choices)
        out.append({"context": context, "choices": choices, "label": choices.index(ending)})
    return out


def write(path: Path, rows: list[dict]) -> None:
    with path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))


def build() -> None:
    rng = random.Random(SEED)
    rows: dict[tuple[str, str], list[dict]] = {}
    for source in SOURCES:
        docs = documents(source)
        splits = {
            "train": [d for i, d in enumerate(docs) if i % FEWSHOT_EVERY == 0],
            "test": [d for i, d in enumerate(docs) if i % FEWSHOT_EVERY],
        }
        for split, split_docs in splits.items():
            for task, examples in (
                ("lastword", lastword_examples(split_docs)),
                ("nextpassage", nextpassage_examples(split_docs, rng)),
            ):
                picked = rng.sample(examples, PER_SOURCE[split])
                rows.setdefault((task, split), []).extend({**row, "source": source} for row in picked)
    for (task, split), task_rows in sorted(rows.items()):
        write(HERE / f"{task}-{split}.jsonl.gz", task_rows)
        print(f"{task}-{split}.jsonl.gz: {len(task_rows)} examples")


if __name__ == "__main__":
    build()
