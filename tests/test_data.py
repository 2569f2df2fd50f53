"""Data: recipes prepared into bins from real files through `datasets` (the shipped corpus, and local
stand-ins for the paper's hub sources), the step-addressed loader, and each bad input as one DataError."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer

from cart_sweeps.compose import compose_config
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.loader import Prepared, load_prepared, train_batch, val_windows
from cart_sweeps.data.prepare.__main__ import main as prepare_main
from cart_sweeps.metric import KINDS
from cart_sweeps.train.loop import eval_metrics

EMBEDDED = Path(__file__).resolve().parents[1] / "src" / "cart_sweeps" / "data" / "embedded"
STANDINS = Path(__file__).resolve().parent / "fixtures" / "paper_standins"
STANDIN_SOURCES = {  # name -> (files, chunks per cycle): the paper's tiny x3, wiki x3, fw x4
    "tiny": (["tinystories/train.jsonl"], 3),
    "wiki": (["wikipedia/train-00000-of-00003.parquet", "wikipedia/train-00001-of-00003.parquet"], 3),
    "fw": (["fineweb-edu/000_00000.parquet"], 4),
}
VAL_TOKENS = 800


def standin_overrides(cache: Path, train_tokens: int | None = None) -> list[str]:
    """data=paper_mix with its three hub sources pointed at local json/parquet files, and a small BPE."""

    def spec(name: str, builder: str, pattern: str, extra: str) -> str:
        return f"{{name: {name}, path: {builder}, data_dir: '{STANDINS}', data_files: ['{pattern}'], {extra}}}"

    sources = [
        spec("tiny", "json", "tinystories/train.jsonl", "chunks_per_cycle: 3"),
        spec("wiki", "parquet", "wikipedia/train-0000[0-1]-of-00003.parquet", "chunks_per_cycle: 3"),
        spec("fw", "parquet", "fineweb-edu/000_00000.parquet", "chunks_per_cycle: 4"),
    ]
    n = f"split: train, n_tokens: {VAL_TOKENS}"
    validation = [
        spec("tiny", "json", "tinystories/validation.jsonl", n),
        spec("wiki", "parquet", "wikipedia/train-00002-of-00003.parquet", f"{n}, last_docs: 20"),
        spec("edu", "parquet", "fineweb-edu/001_00000.parquet", f"{n}, shuffle_seed: 42"),
    ]
    return [
        "data=paper_mix",
        f"data.cache_dir={cache}",
        "data.tokenizer.kind=bpe",
        "data.tokenizer.name=standin-bpe",
        "data.tokenizer.vocab_size=512",
        "data.chunk_tokens=64",
        f"data.train_tokens={'null' if train_tokens is None else train_tokens}",
        f"data.sources=[{','.join(sources)}]",
        f"data.validation=[{','.join(validation)}]",
    ]


def fixture_texts(files: list[str]) -> list[str]:
    """The stand-ins' documents read directly (not through `datasets`), for reference streams."""
    texts: list[str] = []
    for name in files:
        path = STANDINS / name
        if path.suffix == ".jsonl":
            texts += [json.loads(line)["text"] for line in path.open()]
        else:
            texts += pd.read_parquet(path)["text"].tolist()
    return texts


def reference_stream(texts: list[str], tok: Tokenizer) -> np.ndarray:
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    docs = [[bos, *tok.encode(t, add_special_tokens=False).ids, eos] for t in texts if t.strip()]
    return np.concatenate(docs).astype(np.uint16)


@pytest.fixture(scope="session")
def embedded(data_cache) -> Prepared:
    cfg = compose_config(["scale=tiny"])  # data=embedded is scale=tiny's default
    assert cfg.data.name == "embedded"
    return load_prepared(cfg.data)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_embedded_corpus_prepares_into_bins(embedded):
    m = embedded.manifest
    assert m["tokenizer"]["kind"] == "bpe" and embedded.vocab_size == 4096
    assert embedded.tokenizer_path.is_file() and list(embedded.val) == ["shakespeare", "bible", "austen"]
    per_source = m["train"]["tokens_per_source"]
    assert sum(per_source.values()) == len(embedded.train) == m["train"]["tokens"] > 3_000_000
    assert all(n % 1024 == 0 for n in per_source.values())  # whole chunks: it stopped when a source ran out
    for name, tokens in embedded.val.items():
        assert len(tokens) == 40_000 and tokens[0] == m["tokenizer"]["bos_id"]
        assert 2.5 < embedded.bytes_per_token[name] < 4.5
        entry = m["validation"][name]
        assert hashlib.sha256(np.asarray(tokens).tobytes()).hexdigest() == entry["sha256"]

    # Interleave order, read off the bin: chunk k of the first cycles decodes to text of its source.
    tok = Tokenizer.from_file(str(embedded.tokenizer_path))
    texts = {}
    for name in per_source:
        with gzip.open(EMBEDDED / f"{name}-train.jsonl.gz", "rt") as f:
            texts[name] = "\n".join(json.loads(line)["text"] for line in f)
    schedule = ["shakespeare"] * 3 + ["bible"] * 2 + ["austen"] * 2
    specials = {m["tokenizer"]["bos_id"], m["tokenizer"]["eos_id"]}
    for k in range(2 * len(schedule)):
        chunk = embedded.train[k * 1024 : (k + 1) * 1024].tolist()
        pieces, cur = [], []
        for t in chunk:
            if t in specials:
                pieces.append(cur)
                cur = []
            else:
                cur.append(t)
        text = tok.decode(max([*pieces, cur], key=len))
        probe = text[len(text) // 3 :][:60]
        found = [name for name, body in texts.items() if probe in body]
        assert found == [schedule[k % len(schedule)]], (k, probe)


def test_paper_recipe_code_path_on_local_standins(tmp_path):
    data = load_prepared(compose_config(standin_overrides(tmp_path)).data)
    m = data.manifest
    assert data.vocab_size == 512 and m["tokenizer"]["kind"] == "bpe" and m["chunk_tokens"] == 64
    tok = Tokenizer.from_file(str(data.tokenizer_path))
    bos, eos = m["tokenizer"]["bos_id"], m["tokenizer"]["eos_id"]

    # Reference: each source a BOS + ids + EOS stream (empty documents skipped), interleaved tiny x3,
    # wiki x3, fw x4 in 64-token chunks until a source cannot fill a chunk.
    streams = {name: reference_stream(fixture_texts(files), tok) for name, (files, _) in STANDIN_SOURCES.items()}
    schedule = [name for name, (_, k) in STANDIN_SOURCES.items() for _ in range(k)]
    pos, chunks = dict.fromkeys(streams, 0), []
    while True:
        name = schedule[len(chunks) % len(schedule)]
        if pos[name] + 64 > len(streams[name]):
            break
        chunks.append(streams[name][pos[name] : pos[name] + 64])
        pos[name] += 64
    assert len(chunks) > 3 * len(schedule)
    assert np.array_equal(data.train, np.concatenate(chunks))
    assert m["train"]["tokens_per_source"] == pos
    cycles = schedule * 3
    for k, name in enumerate(cycles):  # chunk k of the bin is the next unread chunk of source cycles[k]
        j = cycles[:k].count(name)
        assert np.array_equal(data.train[k * 64 : (k + 1) * 64], streams[name][j * 64 : (j + 1) * 64])
    # Each document is BOS + ids + EOS: the bin opens with the first story, whole.
    first_eos = int(np.flatnonzero(np.asarray(data.train) == eos)[0])
    assert data.train[0] == bos and first_eos < 3 * 64
    assert tok.decode(data.train[1:first_eos].tolist()) == fixture_texts(["tinystories/train.jsonl"])[0]

    # Validation: the first n_tokens; Wikipedia from its file's last 20 documents; FineWeb-Edu shuffled
    # with random.Random(42) first, as the author's script did.
    wiki = fixture_texts(["wikipedia/train-00002-of-00003.parquet"])[-20:]
    edu = fixture_texts(["fineweb-edu/001_00000.parquet"])
    order = list(range(len(edu)))
    random.Random(42).shuffle(order)
    expected = {
        "tiny": fixture_texts(["tinystories/validation.jsonl"]),
        "wiki": wiki,
        "edu": [edu[i] for i in order],
    }
    for name, texts in expected.items():
        assert np.array_equal(data.val[name], reference_stream(texts, tok)[:VAL_TOKENS]), name
        entry = m["validation"][name]
        used = [t for t in texts if t.strip()][: entry["documents"]]
        n_tokens = len(reference_stream(used, tok))
        assert entry["bytes_per_token"] == pytest.approx(sum(len(t.encode()) for t in used) / n_tokens)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_train_batch_is_addressed_by_step(embedded, caplog):
    tokens, seq, mbs, accum = embedded.train, 16, 4, 3
    x, y = train_batch(tokens, 2, 1, mbs, accum, seq)
    assert x.shape == y.shape == (mbs, seq) and x.dtype == y.dtype == torch.int64
    first = (2 * accum + 1) * mbs  # windows of micro-batch 1 of step 2
    for row in range(mbs):
        start = (first + row) * seq
        window = torch.from_numpy(tokens[start : start + seq + 1].astype(np.int64))
        assert torch.equal(x[row], window[:-1]) and torch.equal(y[row], window[1:])
    # Past the bin's last whole micro-batch the order wraps to the start, logged once.
    n_batches = (len(tokens) - 1) // seq // mbs
    step = n_batches // accum + 1
    with caplog.at_level(logging.WARNING, logger="cart_sweeps.data.loader"):
        wrapped = [train_batch(tokens, step, 0, mbs, accum, seq)[0] for _ in range(2)]
    start = (step * accum % n_batches) * mbs * seq
    assert torch.equal(wrapped[0][0], torch.from_numpy(tokens[start : start + seq].astype(np.int64)))
    assert torch.equal(wrapped[0], wrapped[1])
    assert sum("wraps around" in r.message for r in caplog.records) == 1


BATCHES_SCRIPT = """
import hashlib, sys
from cart_sweeps.compose import compose_config
from cart_sweeps.data.loader import load_prepared, train_batch
data = load_prepared(compose_config(sys.argv[1:]).data)
for step, micro in [(0, 0), (0, 1), (7, 1), (10_000, 0)]:
    x, y = train_batch(data.train, step, micro, 4, 2, 32)
    print(step, micro, hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())
print(data.folder)
"""


@pytest.mark.slow
def test_batches_equal_across_processes_and_restarts(tmp_path):
    cache = tmp_path / "cache"
    overrides = standin_overrides(cache, train_tokens=3000)  # 3,000 tokens: the last chunk cut to fit
    # Two processes start at once on an empty cache: one prepares, the other waits and reuses it.
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BATCHES_SCRIPT, *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    *lines, folder = outs[0][0].strip().splitlines()
    folder = Path(folder)
    assert sorted(p.name for p in cache.iterdir()) == [folder.name, f"{folder.name}.lock"]
    # A restarted run (this process) reads the same batches, with no loader state.
    data = load_prepared(compose_config(overrides).data)
    assert data.folder == folder and len(data.train) == 3000
    for line in lines:
        step, micro, digest = line.split()
        x, y = train_batch(data.train, int(step), int(micro), 4, 2, 32)
        assert hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest() == digest


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_val_windows_and_metrics(embedded):
    tokens = embedded.val["austen"]
    windows = val_windows(tokens, 50, 64)
    assert windows.shape == (50, 65) and windows.dtype == torch.int64
    assert torch.equal(windows[3], torch.from_numpy(tokens[192:257].astype(np.int64)))
    with pytest.raises(DataError, match="lower trainer.eval_windows"):
        val_windows(tokens, 1000, 64)
    bpt = embedded.bytes_per_token["austen"]
    metrics = eval_metrics(mean_ce=2.5, bytes_per_token=bpt)
    assert metrics == pytest.approx({"ce": 2.5, "ppl": math.exp(2.5), "bpb": 2.5 / math.log(2) / bpt})
    assert set(metrics) == {
        k.name for k in KINDS if k.per_set
    }  # what the ledger, preflight and the analysis read them as


@pytest.fixture
def damaged(embedded, tmp_path):
    """A copy of the prepared embedded recipe in a cache of its own, to break."""
    folder = tmp_path / embedded.folder.name
    shutil.copytree(embedded.folder, folder)
    return compose_config(["scale=tiny", f"data.cache_dir={tmp_path}"]).data, folder


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_missing_bin(damaged):
    data_cfg, folder = damaged
    (folder / "val_bible.bin").unlink()
    with pytest.raises(DataError, match=r"val_bible.bin is missing; delete .*cart_sweeps.data.prepare data=embedded"):
        load_prepared(data_cfg)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("cut", [1, 2])  # an odd size; one whole token short of the manifest
def test_truncated_bin(damaged, cut):
    data_cfg, folder = damaged
    path = folder / "train.bin"
    os.truncate(path, path.stat().st_size - cut)
    with pytest.raises(DataError, match=r"train.bin is truncated or corrupt .*cart_sweeps.data.prepare data=embedded"):
        load_prepared(data_cfg)


def test_corrupt_bin_fails_its_hash(damaged):
    data_cfg, folder = damaged
    with (folder / "val_austen.bin").open("r+b") as f:
        f.write(b"\xff\xff")
    with pytest.raises(DataError, match="val_austen.bin is not what was prepared"):  # its size is fine
        load_prepared(data_cfg)


def test_manifest_of_another_recipe(damaged):
    data_cfg, folder = damaged
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "recipe_hash": "0123456789ab"}))
    with pytest.raises(DataError, match="is for recipe hash 0123456789ab, not "):
        load_prepared(data_cfg)


def test_vocab_must_fit_uint16(tmp_path):
    cfg = compose_config(["data=embedded", f"data.cache_dir={tmp_path}", "data.tokenizer.vocab_size=70000"])
    with pytest.raises(DataError, match=r"does not fit the uint16 bins .* data.tokenizer.vocab_size<=65536"):
        load_prepared(cfg.data)
    assert not list(tmp_path.iterdir())


def test_hub_unreachable_offline_fails_at_once_and_leaves_nothing(tmp_path, monkeypatch):
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"  # set by conftest
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing cached
    cfg = compose_config(["data=paper_mix", f"data.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError, match=r"cannot fetch tokenizer NousResearch/Llama-2-7b-hf.*use data=embedded"):
        load_prepared(cfg.data)
    cfg = compose_config(["data=paper_mix", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenizer.kind=bpe"])
    with pytest.raises(DataError, match=r"cannot open source 'tiny' from roneneldan/TinyStories.*data=embedded"):
        load_prepared(cfg.data)
    assert all(p.suffix == ".lock" for p in (tmp_path / "cache").iterdir())  # no half-written folder


def test_cli_usage_and_one_line_error(tmp_path, capsys):
    prepare_main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m cart_sweeps.data.prepare")
    out = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.data.prepare", "data=paper_mix", f"data.cache_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: data=paper_mix: cannot fetch tokenizer")


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_data_cache_is_per_user_by_default(tmp_path):
    """Every working folder shares one cache: $XDG_CACHE_HOME/cart_sweeps, else ~/.cache/cart_sweeps (as HF
    and torch keep theirs); CART_SWEEPS_CACHE still overrides (every test here sets it)."""
    bare = {k: v for k, v in os.environ.items() if k not in ("CART_SWEEPS_CACHE", "XDG_CACHE_HOME")}

    def cache_dir(folder: str, **env: str) -> str:
        (tmp_path / folder).mkdir(exist_ok=True)
        command = [sys.executable, "-m", "cart_sweeps", "--cfg", "job", "-p", "data.cache_dir", "--resolve"]
        done = subprocess.run(command, cwd=tmp_path / folder, env={**bare, **env}, capture_output=True, text=True)
        return done.stdout.strip()

    home, xdg = tmp_path / "home", tmp_path / "xdg"
    assert cache_dir("a", HOME=str(home)) == cache_dir("b", HOME=str(home)) == f"{home}/.cache/cart_sweeps/data"
    assert cache_dir("a", HOME=str(home), XDG_CACHE_HOME=str(xdg)) == f"{xdg}/cart_sweeps/data"
