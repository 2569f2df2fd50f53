"""TensorBoard, the dashboard researchers already know, offline: `logger=tensorboard` writes each run's rows as
event files in its folder, a backfill writes them for a stage trained without it (once, dated by the run's own
timing), and `tensorboard --logdir <runs>/<stage>` draws one line per run for loss and rho in a real browser.

Real parts: a real tiny stage launched by the real command, read back with TensorBoard's own event reader; the
real `tensorboard` server as a subprocess; Debian's chromium, headless, driven by Playwright. One run's name
comes from a stage file's grid value holding HTML, and a backfilled run carries a NaN and an HTML metric key:
shown as text, and no script runs (issue 48 item 2, carried from the retired viewer).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from stages import dated_by_hand, env, sweep, user_stage
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.util import tensor_util

from cart_sweeps.metric import RHO_LABEL

pytestmark = pytest.mark.slow

HOSTILE = '<img src=x onerror="window.__pwned=1">'
KEY = '<img src=x onerror="window.__pwned=2">'  # a metric key in metrics.jsonl, as the attack had it
STAGE = f"""\
name: board
variants:
  hostile: {{data.tokenizer.revision: '{HOSTILE}', trainer.lr: 0.003}}
  plain: {{trainer.lr: 0.001}}
recipe:
  seed: 42
"""  # two learning rates: two curves apart (one revision alone would train the same model: one line over the other)
TINY = ["scale=tiny", "model.d_model=32", "trainer.steps=6", "trainer.eval_every=3", "trainer.log_every=2"]
LOGGED = "tensorboard.json"


def backfill(cfg: Path, runs: Path) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "cart_sweeps.tensorboard_sync", "backfill", "--config-dir", str(cfg), "stage=board"]
    return subprocess.run([*args, *TINY], env=env(runs), capture_output=True, text=True, timeout=300)


def run_folders(stage_dir: Path) -> list[Path]:
    return sorted(p for p in stage_dir.iterdir() if (p / "metrics.jsonl").is_file())


def rows_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def events(run: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Each scalar tag's (step, wall time, value), as TensorBoard's own reader gives them from the run's files."""
    acc = ea.EventAccumulator(str(run), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    return {
        tag: [(e.step, e.wall_time, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
        if not tag.endswith("/text_summary")
    }


def expected(run: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl by hand as TensorBoard tags: train/<key> and val/<key> by the row's kind, and rho; each
    value as the float32 the event holds; None left out."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows_of(run):
        for key, value in row.items():
            if key in ("step", "kind") or value is None:
                continue
            tag = "rho" if key == "rho" else ("val/" if row["kind"] == "eval" else "train/") + key
            out.setdefault(tag, []).append((row["step"], float(np.float32(value))))
    return out


def values(got: dict[str, list[tuple[int, float, float]]]) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(step, value) for step, _, value in points] for tag, points in got.items()}


def same(a: dict, b: dict) -> bool:
    """Equal, NaN equal to NaN."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache) -> tuple[Path, Path]:
    """Stage `board` (two CART runs, one named after a stage file's value holding HTML) trained with
    logger=tensorboard."""
    base = tmp_path_factory.mktemp("tb")
    cfg = user_stage(base, STAGE)
    runs = base / "runs"
    done = sweep(runs, "--config-dir", str(cfg), "stage=board", *TINY, "logger=tensorboard", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return cfg, runs


@pytest.fixture(scope="module")
def backfilled(trained, tmp_path_factory) -> Path:
    """The stage copied without its event files, one run's rows given a NaN grad norm and an HTML metric key
    (a row's keys are what the backfill writes as tags), then backfilled: the copy's stage folder."""
    cfg, trained_runs = trained
    runs = tmp_path_factory.mktemp("tb-backfilled") / "runs"
    shutil.copytree(trained_runs / "board", runs / "board", ignore=shutil.ignore_patterns("events.*", LOGGED))
    plain = next(p for p in run_folders(runs / "board") if HOSTILE not in p.name)
    rows = rows_of(plain)
    for row in rows:
        if row["kind"] == "train" and row["step"] == 4:
            row["grad_norm"], row[KEY] = math.nan, 1.0
    (plain / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = backfill(cfg, runs)
    assert done.returncode == 0 and "2 runs written (10 rows), 0 already" in done.stdout, done.stdout + done.stderr
    return runs / "board"


def test_the_logger_writes_each_row_of_each_run_as_tensorboard_reads_it(trained):
    _, runs = trained
    folders = run_folders(runs / "board")
    assert len(folders) == 2 and any(HOSTILE in p.name for p in folders)
    for run in folders:
        got = events(run)
        assert values(got) == expected(run)  # loss, lr, rho, tokens/s, each validation set: every value
        assert {"train/loss", "train/lr", "train/tokens_per_s", "rho", "val/ppl_austen", "val/bpb_bible"} <= set(got)
        acc = ea.EventAccumulator(str(run), size_guidance={ea.TENSORS: 0})
        acc.Reload()
        assert acc.SummaryMetadata("rho").summary_description == RHO_LABEL
        [about] = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors("run/text_summary")]
        summary = json.loads((run / "summary.json").read_text())
        assert f"name `{summary['label']}`, group `stage-board`, id `board-{summary['run_id']}`" in about
        assert "`cart`" in about and "`d32`" in about and "`seed42`" in about  # the W&B tags
        assert json.loads((run / LOGGED).read_text())["step"] == 6


def test_a_backfill_writes_the_rows_once_dated_by_the_runs_own_timing(trained, backfilled):
    """Every row, as the live logger wrote it, at the time the run logged it (not the backfill's time: W&B's
    backfilled runs had a runtime of about 0 s); a second backfill writes nothing."""
    cfg, _ = trained
    for run in run_folders(backfilled):
        got = events(run)
        assert same(values(got), expected(run))
        by_hand = dated_by_hand(run)
        for tag, points in got.items():
            for step, wall, _ in points:
                assert wall == pytest.approx(by_hand[step], abs=1e-3), (tag, step)
    [keyed] = [run for run in run_folders(backfilled) if f"train/{KEY}" in events(run)]
    assert math.isnan(dict((s, v) for s, _, v in events(keyed)["train/grad_norm"])[4])
    written = [*backfilled.glob("*/events.*"), *backfilled.glob(f"*/{LOGGED}")]
    before = {p: p.stat().st_mtime_ns for p in written}
    again = backfill(cfg, backfilled.parent)
    assert again.returncode == 0 and "0 runs written (0 rows), 2 already in TensorBoard" in again.stdout, again.stdout
    assert [*backfilled.glob("*/events.*"), *backfilled.glob(f"*/{LOGGED}")] == written  # nothing new
    assert {p: p.stat().st_mtime_ns for p in written} == before  # nothing rewritten


def test_two_backfills_at_once_write_each_run_once(trained, tmp_path):
    cfg, trained_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(trained_runs / "board", runs / "board", ignore=shutil.ignore_patterns("events.*", LOGGED))
    args = [sys.executable, "-m", "cart_sweeps.tensorboard_sync", "backfill", "--config-dir", str(cfg), "stage=board"]
    both = [
        subprocess.Popen([*args, *TINY], env=env(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    said = [p.communicate(timeout=300) for p in both]
    assert [p.returncode for p in both] == [0, 0], said
    for run in run_folders(runs / "board"):
        assert len(list(run.glob("events.*"))) == 1  # one writer each, whichever backfill it was
        assert values(events(run)) == expected(run)


# Browser ---------------------------------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def browser_or_skip() -> None:
    """A test needing the browser skips, saying why, where Debian's chromium or Playwright is missing, or fails
    instead when CART_BROWSER_REQUIRED=1 (CI installs chromium itself)."""
    reason = None
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no {CHROMIUM} (Debian's package: apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "no Playwright for Python (pip install playwright; never `playwright install`)"
    if reason and os.environ.get("CART_BROWSER_REQUIRED") == "1":
        pytest.fail(f"a browser is required (CART_BROWSER_REQUIRED=1) but {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def colour_pixels(png: bytes, rgb: tuple[int, int, int]) -> int:
    """Pixels of a screenshot within a small distance of `rgb` (a line's antialiased core)."""
    from io import BytesIO

    from PIL import Image

    pixels = np.asarray(Image.open(BytesIO(png)).convert("RGB"), dtype=float)
    return int((np.linalg.norm(pixels - np.array(rgb, dtype=float), axis=2) < 30).sum())


def test_tensorboard_draws_one_line_per_run_for_loss_and_rho_in_a_browser(backfilled, tmp_path):
    """`tensorboard --logdir <runs>/<stage>` in headless Chromium: the loss and rho cards each list every run once
    in their data table and show each run's own colour as a line in the chart, cross-checked with TensorBoard's
    data API; run and tag names holding HTML are shown as text, no script runs; the NaN is served as "NaN"."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    names = [p.name for p in run_folders(backfilled)]
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = (tmp_path / "tensorboard.log").open("w")
    args = ["--logdir", str(backfilled), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", *args], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:  # served, and every run's scalars loaded
            try:
                tags = get(url + "data/plugin/scalars/tags")
                if isinstance(tags, dict) and all("rho" in tags.get(n, {}) for n in names):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "tensorboard.log").read_text()[-3000:]
            time.sleep(0.5)
        assert sorted(tags) == sorted(names)  # one TensorBoard run per run folder, the hostile name as given
        assert tags[names[0]]["rho"]["description"] == f"<p>{RHO_LABEL}</p>"
        nan_run = next(n for n in names if f"train/{KEY}" in tags[n])
        query = urllib.parse.urlencode({"run": nan_run, "tag": "train/grad_norm"})
        assert [p[2] for p in get(f"{url}data/plugin/scalars/scalars?{query}")][1] == "NaN"  # valid JSON, no crash

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)  # a fresh profile of its own
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "#timeseries")
            swatches = page.locator("button.run-color-swatch")
            swatches.nth(len(names) - 1).wait_for(timeout=60_000)
            colours = {}  # run name -> its colour, as the run selector shows it beside the name
            for i in range(swatches.count()):
                row_text = swatches.nth(i).evaluate("b => b.closest('tb-data-table-content-row').textContent")
                style = swatches.nth(i).get_attribute("style") or ""
                rgb = tuple(int(v) for v in style.split("rgb(")[1].split(")")[0].split(","))
                colours[next(n for n in names if n in " ".join(row_text.split()))] = rgb
            assert sorted(colours) == sorted(names)
            for tag in ("train/loss", "rho"):
                card = page.locator("scalar-card", has=page.locator(f'tb-truncated-path[title="{tag}"]'))
                card.scroll_into_view_if_needed()
                table = card.locator("tb-data-table-content-row")
                table.nth(len(names) - 1).wait_for(timeout=60_000)  # one row per run
                listed = [" ".join(t.split()) for t in table.all_text_contents()]
                assert sorted(next(n for n in names if n in t) for t in listed) == sorted(names), listed
                deadline = time.monotonic() + 60
                while True:  # the lines are drawn in the card's canvas, each series as its data arrives
                    chart = card.locator("canvas").first.screenshot()
                    missing = [name for name, rgb in colours.items() if colour_pixels(chart, rgb) < 100]
                    if not missing or time.monotonic() > deadline:
                        break
                    page.wait_for_timeout(500)
                assert not missing, f"no {tag} line drawn for {missing} in their colours {colours}"
                card.screenshot(path=str(tmp_path / f"{tag.replace('/', '_')}.png"))
            assert page.locator("tb-truncated-path", has_text=KEY).count() == 1  # a tag shown as its text
            page.screenshot(path=str(tmp_path / "tensorboard.png"), full_page=True)
            page.goto(url + "#text")
            page.get_by_text(f"stage-{backfilled.name}", exact=True).first.wait_for(timeout=60_000)  # W&B's group
            page.wait_for_timeout(1000)
            assert page.evaluate("window.__pwned") is None  # no onerror ran, on either page
            assert page.locator("img[onerror]").count() == 0
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
