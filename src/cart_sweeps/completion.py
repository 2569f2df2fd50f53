"""Shell completion for `python -m cart_sweeps` and `cart-sweeps` (`-sc install=bash`): Hydra's own script
completes `python FILE.py` only, so this one recognises both spellings and asks Hydra's query (`-sc query=bash`).
"""

from __future__ import annotations

import os
import re

FUNCTION = "_cart_sweeps_complete"
COMMANDS = "python python3 cart-sweeps"

INSTALL = f"""\
{FUNCTION}() {{
    local words=($COMP_LINE) helper
    if [[ "${{words[0]}}" == *cart-sweeps ]]; then
        helper="${{words[0]}}"
    elif [[ "${{words[0]}}" == *python* && "${{words[1]}}" == -m && "${{words[2]}}" == cart_sweeps ]]; then
        helper="${{words[0]}} -m cart_sweeps"
    else
        return  # any other python command: the shell's default completion
    fi
    local choices
    choices=$(COMP_POINT=$COMP_POINT COMP_LINE=$COMP_LINE $helper -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "${{words[$COMP_CWORD]}}"))
}}
COMP_WORDBREAKS=${{COMP_WORDBREAKS//=}}
complete -o nospace -o default -F {FUNCTION} {COMMANDS}"""
UNINSTALL = f"complete -r {COMMANDS} 2>/dev/null; unset -f {FUNCTION}"

_MODULE_LINE = re.compile(r"^\s*\S*python[\d.]*\s+-m\s+cart_sweeps(?=\s|$)")


def script(overrides: list[str]) -> str | None:
    """The script for `-sc install=bash|zsh` or `uninstall=...`; None for what Hydra answers itself (queries)."""
    scripts = {"install": INSTALL, "uninstall": UNINSTALL}
    return next((scripts[a] for a in (o.partition("=")[0] for o in overrides) if a in scripts), None)


def name_the_program_once() -> None:
    """`python -m cart_sweeps ARGS` -> `cart_sweeps ARGS` in COMP_LINE: Hydra's query strips one word as the
    program (or `python FILE`), and would read `-m cart_sweeps` as overrides."""
    line = os.environ.get("COMP_LINE", "")
    if _MODULE_LINE.match(line):
        os.environ["COMP_LINE"] = _MODULE_LINE.sub("cart_sweeps", line, count=1)
