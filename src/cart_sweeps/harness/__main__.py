"""`python -m cart_sweeps.harness <lm-eval flags>`: lm-eval's own CLI with the "cart" model registered (lm-eval
0.4.13 has no entry-point plugins, so `lm_eval --model cart` cannot see it) and the shipped tasks on the include path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cart_sweeps.config import ConfigError

USAGE = """\
Score a trained run on lm-eval tasks: lm-eval's own command line, with --model cart the default.

  --model_args run_dir=DIR[,n_loops=R]   DIR: a trained run's folder (runs/<stage>/<label>-<id>); R: the
                                         inference loop count (default: the trained R)
  --output_path DIR                      results (and --log_samples) land in DIR/<label>-<id>/
  --device DEV                           default: where the run itself trained (cpu without a GPU)

The offline tasks cart_lastword, cart_nextpassage (tag cart_tiny) are always on the include path:

  python -m cart_sweeps.harness --model_args run_dir=runs/2/d96-P6-R6-s42-<id>,n_loops=6 \\
      --tasks cart_tiny --limit 20 --batch_size 8 --output_path analysis/out/lm_eval

Every other lm-eval flag passes through (`python -m cart_sweeps.harness run --help` lists them).
"""
MISSING = "python -m cart_sweeps.harness needs lm-eval: pip install 'cart_sweeps[eval]'"


def for_cart(args: argparse.Namespace) -> None:
    """cart's defaults where the user left them: the model, the run's own device, an output folder named after it."""
    from cart_sweeps.harness.model import run_name, saved_config
    from cart_sweeps.train.setup import pick_device

    if args.model is None and getattr(args, "config", None) is None:
        args.model = "cart"
    if args.model != "cart" or "run_dir" not in (args.model_args or {}):
        return
    run_dir = Path(str(args.model_args["run_dir"]))
    if args.device is None:
        args.device = str(pick_device(saved_config(run_dir).trainer.device))
    if args.output_path and not args.output_path.endswith(".json"):  # lm-eval: <stem>_<time>.json beside it
        args.output_path = str(Path(args.output_path) / run_name(run_dir) / "results.json")


def main() -> None:
    if sys.argv[1:] in ([], ["-h"], ["--help"]):  # before lm-eval's imports (seconds)
        print(USAGE)
        return
    try:
        import lm_eval.models  # noqa: F401  lm-eval's own models stay available (ours is registered first)
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:
        print(f"error: {MISSING}", file=sys.stderr)
        sys.exit(2)
    import cart_sweeps.harness.model  # noqa: F401  registers "cart"
    from cart_sweeps.harness import TASKS_DIR

    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    try:
        if args.command == "run":
            for_cart(args)
        if "include_path" in args:  # run, ls and validate: ours first, the user's after (theirs win a name clash)
            args.include_path = [str(TASKS_DIR), *([args.include_path] if args.include_path else [])]
        parser.execute(args)
    except ConfigError as err:  # a user mistake (a DataError among them): one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
