"""A trained run as an lm-eval model: `--model cart --model_args run_dir=DIR,n_loops=R`, all read from the run
folder (model, weights, tokenizer). A document starts with BOS as in training; a long input keeps its last tokens.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from cart_sweeps.config import ConfigError
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.modelspec import spec_of
from cart_sweeps.record.runfolder import CONFIG, read_summary
from cart_sweeps.train.checkpoint import load_trained
from cart_sweeps.train.loop import autocast
from cart_sweeps.train.setup import amp_dtype, pick_device

log = logging.getLogger(__name__)
DEFAULT_MAX_GEN_TOKS = 64  # generate_until's length when a task names none (lm-eval's own default is 256)


def saved_config(run_dir: Path) -> DictConfig:
    """The run's own config.yaml (written before its first step), or a one-line ConfigError."""
    path = run_dir / CONFIG
    if not path.is_file():
        raise ConfigError(f"run_dir={run_dir} holds no config.yaml; point it at a trained run's folder")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"run_dir={run_dir}: config.yaml is not a run's config; point it at a trained run's folder")
    return cfg


def run_name(run_dir: Path) -> str:
    """`<label>-<run id[:8]>` from the run's summary (as a stage names its folders), else the folder's name."""
    summary = read_summary(run_dir)
    if summary is None or not (summary.label and summary.run_id):
        return run_dir.resolve().name
    return f"{summary.label}-{summary.run_id[:8]}"


def _device(asked: str | None, run_default: str) -> torch.device:
    """The --device asked for (the CPU, said in one line, where no GPU is visible), else where the run computed."""
    if asked and asked.startswith("cuda") and not torch.cuda.is_available():
        log.warning("--device %s: no CUDA GPU is visible; evaluating on the CPU", asked)
        asked = None
    return torch.device(asked) if asked else pick_device(run_default)


def _batch_size(value: int | str | None) -> int:
    """lm-eval hands --batch_size over as text; only a fixed size makes sense for these small models."""
    try:
        size = int(value) if value is not None else 8
    except ValueError:
        raise ConfigError(f"--batch_size {value} is not supported by the cart model; pass a number, e.g. 8") from None
    if size < 1:
        raise ConfigError(f"--batch_size {size} must be >= 1")
    return size


def _loops(n_loops: int | str | None, model: DictConfig) -> int | None:
    """The inference R (None: the trained R), checked by the model's own rule before any weight loads."""
    if n_loops is None:
        return None
    check = spec_of(model).check_loops
    if check is None:
        raise ConfigError(f"n_loops={n_loops}: a {model.name} model has no loops; drop n_loops from --model_args")
    check(model, int(n_loops), "n_loops")
    return int(n_loops)


@register_model("cart")
class CartLM(TemplateLM):
    """loglikelihood (via TemplateLM's encoding), loglikelihood_rolling and greedy generate_until."""

    def __init__(
        self,
        run_dir: str,
        n_loops: int | None = None,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        device: str | None = None,
        step: int | None = None,  # the checkpoint to read (None: the newest)
    ) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.cfg = saved_config(self.run_dir)
        self._device = _device(device, self.cfg.trainer.device)
        self.amp = amp_dtype(self.cfg.trainer.precision, self._device)
        self.n_loops = _loops(n_loops, self.cfg.model)
        self.model, self.step = load_trained(self.run_dir, self.cfg.model, self._device, "run_dir", step)
        data = load_prepared(self.cfg.data)
        self.tok = Tokenizer.from_file(str(data.tokenizer_path))
        self.bos_id = data.manifest["tokenizer"]["bos_id"]
        self.eos_id = data.manifest["tokenizer"]["eos_id"]
        self.max_length = self.cfg.model.max_seq_len
        self.batch_size = _batch_size(batch_size)

    @property
    def eot_token_id(self) -> int:
        return self.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.bos_id  # training wraps each document as BOS + text + EOS

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        ids = self.tok.encode(string, add_special_tokens=False).ids
        return ids if add_special_tokens is False else [self.bos_id, *ids]

    def tok_decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor:
        """Log-softmax (fp32) of the model over right-padded rows: [B, T, V]."""
        width = max(len(r) for r in rows)
        batch = torch.tensor([r + [self.eos_id] * (width - len(r)) for r in rows], device=self._device)
        with autocast(self._device, self.amp):
            logits = self.model(batch, n_loops=self.n_loops)
        return F.log_softmax(logits.float(), dim=-1)

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), whether greedy decoding gives the continuation) per pair,
        each input left-truncated to the model's context; batched longest first."""
        rows = [((ctx + cont)[-(self.max_length + 1) :][:-1], cont) for ctx, cont in pairs]
        collator = Collator(rows, sort_fn=lambda r: (-len(r[0]), tuple(r[0])))
        out = []
        for chunk in collator.get_batched(n=self.batch_size):
            logprobs = self._logprobs([row for row, _ in chunk])
            for (row, continuation), lp in zip(chunk, logprobs, strict=True):
                n = len(continuation)
                picked = lp[len(row) - n : len(row)]
                target = torch.tensor(continuation, device=picked.device)
                total = picked.gather(1, target[:, None]).sum().item()
                out.append((total, bool((picked.argmax(-1) == target).all())))
        return collator.get_original(out)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results = self._score([(context, continuation) for _, context, continuation in requests])
        for (key, _, _), result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Each document's total log-likelihood, scored in disjoint windows of the model's context."""
        out = []
        for request in requests:
            (text,) = request.args
            windows = get_rolling_token_windows(
                self.tok_encode(text, add_special_tokens=False), self.bos_id, self.max_length, context_len=1
            )
            pairs = [make_disjoint_window(w) for w in windows]
            total = sum(score for score, _ in self._score(pairs))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding, one request at a time, until a stop string, EOS or max_gen_toks."""
        out = []
        for request in requests:
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(gen_kwargs, DEFAULT_MAX_GEN_TOKS)
            until = [s for s in handle_stop_sequences(kwargs["until"], eos=self.tok.id_to_token(self.eos_id)) if s]
            ids = self.tok_encode(context)
            new: list[int] = []
            text = ""
            for _ in range(kwargs["max_gen_toks"]):
                logprobs = self._logprobs([(ids + new)[-self.max_length :]])
                token = int(logprobs[0, -1].argmax())
                if token == self.eos_id:
                    break
                new.append(token)
                text = self.tok_decode(new)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in lm-eval's results JSON under `config`."""
        return {
            "run_dir": str(self.run_dir),
            "checkpoint_step": self.step,
            "trained_n_loops": self.cfg.model.get("n_loops"),
            "eval_n_loops": self.n_loops,
        }
