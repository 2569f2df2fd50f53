"""`python -m cart_sweeps.harness <lm-eval flags>`: lm-eval's own CLI, with the "cart" model registered and
the shipped offline tasks (tasks/) on the include path beside any --include_path of the user's.

    python -m cart_sweeps.harness --model cart --model_args run_dir=runs/2/<run>,n_loops=6 \\
        --tasks cart_tiny --batch_size 8 --output_path out/bench

lm-eval 0.4.13 finds models only in its own registry (no entry-point plugins), so a plain `lm_eval
--model cart` cannot see this model; this command is that CLI with the model imported first.
"""

from __future__ import annotations

import sys

import lm_eval.models  # noqa: F401  lm-eval's own models stay available (registering ours first skips their lazy import)
from lm_eval._cli import HarnessCLI
from lm_eval.utils import setup_logging

import cart_sweeps.harness.model  # noqa: F401  registers "cart"
from cart_sweeps.config import ConfigError
from cart_sweeps.data.errors import DataError
from cart_sweeps.harness import TASKS_DIR


def main() -> None:
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    if "include_path" in args:  # run, ls and validate: ours first, the user's after (theirs win a name clash)
        args.include_path = [str(TASKS_DIR), *([args.include_path] if args.include_path else [])]
    try:
        parser.execute(args)
    except (ConfigError, DataError) as err:  # a user mistake: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
