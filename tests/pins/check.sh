#!/usr/bin/env bash
# The pins of pyproject.toml checked at both ends (CI: .ci/run, after `make test-full`): for each of the packages
# whose private APIs cart_sweeps.adapters uses, one fresh venv holds the lowest release its range allows (the `>=`
# bound) and one the highest (pip's pick within the range); each runs the adapters' tests and a few ledger tests.
# No torch: these modules never import it. PINS_DIR=DIR keeps the venvs (default: a temporary folder, removed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES="hydra-core omegaconf optuna submitit"
ALSO="filelock"  # the ledger's launch lock: not pinned at both ends, installed as pyproject asks
TESTS=(
  tests/test_adapters.py
  tests/test_ledger.py::test_trials_read_with_sql_are_optunas_own
  "tests/test_ledger.py::test_finish_writes_what_optuna_tells_in_one_commit[completed]"
  "tests/test_ledger.py::test_finish_writes_what_optuna_tells_in_one_commit[pruned at nan]"
)
dir=${PINS_DIR:-$(mktemp -d)}
mkdir -p "$dir"
[[ -n ${PINS_DIR:-} ]] || trap 'rm -rf "$dir"' EXIT

requirements() {  # $1 = low | high: the packages' requirements at that end of pyproject's ranges
  ALSO="$ALSO" python3 - "$1" $PACKAGES <<'PY'
import os, re, sys, tomllib
end, names = sys.argv[1], sys.argv[2:]
ALSO = os.environ["ALSO"].split()
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for name in names:
    (req,) = [d for d in deps if re.match(rf"{name}\b", d)]
    low = re.search(r">=([0-9.]+)", req).group(1)
    print(f"{name}=={low}" if end == "low" else req)
for name in ALSO:  # what the tested modules import beside them, as pyproject asks for it
    print(next(d for d in deps if re.match(rf"{name}\b", d)))
PY
}

check() {  # $1 = low | high
  local venv="$dir/$1" log="$dir/$1.log"
  mapfile -t reqs < <(requirements "$1")
  {
    python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "${reqs[@]}" "pytest>=8,<9" &&
      echo "$1: $("$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(${PACKAGES// /|}) " | tr -s ' ' | paste -sd,)" &&
      PYTHONPATH=src:tests "$venv/bin/python" -m pytest -q -p no:cacheprovider --noconftest "${TESTS[@]}"
  } >"$log" 2>&1
}

check low & low=$!
check high & high=$!
status=0
for end in low high; do
  pid=${!end}
  if wait "$pid"; then echo "pins $end: passed"; else status=1; echo "pins $end: FAILED"; fi
  grep -E "^$end: |passed|failed|error|Error" "$dir/$end.log" | grep -v "is ignored" | tail -15
done
exit $status
