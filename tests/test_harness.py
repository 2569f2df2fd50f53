"""The LM Evaluation Harness on a tiny trained run, offline, over the shipped task files."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.harness import TASKS_DIR
from cart_sweeps.harness.bench import run_benchmarks
from cart_sweeps.harness.model import CartLM
from cart_sweeps.run import execute
from cart_sweeps.train.checkpoint import load_trained
from cart_sweeps.train.setup import pick_device

LIMIT = 8
# A few steps: the check is the harness against a direct computation, not what the model has learned.
TINY = ["scale=tiny", "trainer.steps=4", "trainer.eval_every=4", "trainer.ckpt_every=4", "trainer.log_every=4"]
TINY += ["trainer.warmup_steps=1"]  # scale=tiny's 5 would outlast the run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_cache) -> Path:
    run_dir = tmp_path_factory.mktemp("bench-run")
    execute(compose_config(TINY), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def harness(tiny_run, tmp_path_factory) -> tuple[dict, Path]:
    """lm-eval's simple_evaluate through the study's call, at R=2 (trained R=4), the first LIMIT questions."""
    out = tmp_path_factory.mktemp("bench-out")
    metrics = run_benchmarks(tiny_run, 2, ["cart_lastword", "cart_nextpassage"], out, limit=LIMIT, batch_size=5)
    return metrics, out


def first_docs(task: str) -> list[dict]:
    with gzip.open(TASKS_DIR / f"{task}-test.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f][:LIMIT]


class Direct:
    """The same log-likelihoods computed straight from the project's model, one text at a time."""

    def __init__(self, run_dir: Path, n_loops: int) -> None:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        self.model, _ = load_trained(run_dir, cfg.model, pick_device("cpu"), "run_dir")
        data = load_prepared(cfg.data)
        self.tok = Tokenizer.from_file(str(data.tokenizer_path))
        self.bos = data.manifest["tokenizer"]["bos_id"]
        self.n_loops = n_loops

    def score(self, context: str, continuation: str) -> tuple[float, bool]:
        """log p(continuation | BOS + context) and whether every continuation token is the argmax."""
        whole = self.tok.encode(context + continuation, add_special_tokens=False).ids
        n_ctx = len(self.tok.encode(context, add_special_tokens=False).ids)
        ids = torch.tensor([[self.bos, *whole]])
        with torch.no_grad():
            logprobs = torch.log_softmax(self.model(ids[:, :-1], n_loops=self.n_loops).float(), -1)[0]
        target = ids[0, 1 + n_ctx :]
        picked = logprobs[n_ctx:]
        return picked.gather(1, target[:, None]).sum().item(), bool((picked.argmax(-1) == target).all())


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_harness_accuracy_equals_a_direct_computation(harness, tiny_run):
    metrics, _ = harness
    direct = Direct(tiny_run, n_loops=2)
    lastword = []
    for doc in first_docs("lastword"):
        context, word = doc["text"].rsplit(" ", 1)
        lastword.append(direct.score(context, " " + word))
    assert metrics["bench_cart_lastword_acc"] == pytest.approx(sum(g for _, g in lastword) / LIMIT)
    assert metrics["bench_cart_lastword_perplexity"] == pytest.approx(
        math.exp(-sum(ll for ll, _ in lastword) / LIMIT), rel=1e-4
    )
    hits = norm_hits = 0
    for doc in first_docs("nextpassage"):
        lls = [direct.score(doc["context"], " " + c)[0] for c in doc["choices"]]
        norm = [ll / len((" " + c).encode()) for ll, c in zip(lls, doc["choices"], strict=True)]
        hits += max(range(len(lls)), key=lls.__getitem__) == doc["label"]
        norm_hits += max(range(len(norm)), key=norm.__getitem__) == doc["label"]
    assert metrics["bench_cart_nextpassage_acc"] == pytest.approx(hits / LIMIT)
    assert metrics["bench_cart_nextpassage_acc_norm"] == pytest.approx(norm_hits / LIMIT)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_results_json_is_lm_evals_own(harness):
    metrics, out = harness
    (path,) = (out / "lm_eval").rglob("results_*.json")
    saved = json.loads(path.read_text())
    assert saved["results"]["cart_lastword"]["acc,none"] == metrics["bench_cart_lastword_acc"]
    assert saved["config"]["eval_n_loops"] == 2 and saved["config"]["trained_n_loops"] == 4
    assert saved["n-shot"]["cart_nextpassage"] == 0


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_rolling_and_generation(tiny_run):
    lm = CartLM(run_dir=str(tiny_run), n_loops=3)
    text = "And God said, Let there be light: and there was light."
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    whole, _ = Direct(tiny_run, n_loops=3).score("", text)
    assert rolling == pytest.approx(whole, rel=1e-5)
    long_text = " ".join([text] * 20)  # several windows of the 128-token context
    (long_ll,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (long_text,), 0)])
    assert math.isfinite(long_ll) and long_ll < rolling
    (generated,) = lm.generate_until([Instance("generate_until", {}, ("And God said", {"max_gen_toks": 5}), 0)])
    assert len(lm.tok_encode(generated, add_special_tokens=False)) <= 5


def test_bad_model_args_are_one_line(tiny_run, tmp_path):
    with pytest.raises(ConfigError, match="n_loops=17"):
        CartLM(run_dir=str(tiny_run), n_loops=17)
    dense = tmp_path / "dense"  # a dense run's config, no weights: the loops are refused before any load
    dense.mkdir()
    cfg = OmegaConf.load(tiny_run / "config.yaml")
    cfg.model.name = "dense"
    OmegaConf.save(cfg, dense / "config.yaml")
    with pytest.raises(ConfigError, match="^n_loops=2: a dense model has no loops; drop n_loops from --model_args$"):
        CartLM(run_dir=str(dense), n_loops=2)
    with pytest.raises(ConfigError, match="holds no config.yaml"):
        CartLM(run_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="--batch_size auto"):
        CartLM(run_dir=str(tiny_run), batch_size="auto")


def harness_cli(*args: str, first: str = "") -> subprocess.CompletedProcess[str]:
    """`python -m cart_sweeps.harness ARGS`; with `first`, that code runs before it in the same process."""
    module = "import runpy; runpy.run_module('cart_sweeps.harness', run_name='__main__')"
    command = ["-c", f"{first}\n{module}"] if first else ["-m", "cart_sweeps.harness"]
    return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, timeout=300)


def test_harness_help_and_missing_lm_eval_are_ours():
    """--help opens with the cart model's arguments; without lm-eval, one line naming the extra to install."""
    shown = harness_cli("--help")
    assert shown.returncode == 0 and "--model_args run_dir=DIR[,n_loops=R]" in shown.stdout
    assert "--model hf" not in shown.stdout
    missing = harness_cli("--tasks", "cart_tiny", first="import sys; sys.modules['lm_eval'] = None")  # not importable
    assert (missing.returncode, missing.stderr) == (
        2,
        "error: python -m cart_sweeps.harness needs lm-eval: pip install 'cart_sweeps[eval]'\n",
    )


@pytest.mark.slow
def test_harness_cli_defaults_to_cart_and_names_its_output_after_the_run(tiny_run, tmp_path):
    """No --model, no --device: the cart model on the run's own device, no device line, and lm-eval's results
    in <output_path>/<label>-<id>/ (lm-eval names that folder after `pretrained`, which cart has not)."""
    done = harness_cli(
        "--model_args",
        f"run_dir={tiny_run},n_loops=2",
        "--tasks",
        "cart_lastword",
        "--limit",
        "4",
        "--output_path",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--device" not in done.stdout + done.stderr
    summary = json.loads((tiny_run / "summary.json").read_text())
    (results,) = (tmp_path / f"{summary['label']}-{summary['run_id'][:8]}").glob("results_*.json")
    assert json.loads(results.read_text())["config"]["model"] == "cart"
