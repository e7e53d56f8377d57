#!/usr/bin/env bash
# Make a venv with EleutherAI's lm-evaluation-harness (PyPI `lm-eval`,
# pinned), the engine of `ttctl eval`'s harness runs: its API models
# (`local-completions`: requests, aiohttp, tenacity) and transformers for
# the Hugging Face tokenizer its log-likelihood requests count tokens with.
# No torch: lm-eval's API models do not need it. Prints the venv's `lm_eval`
# on stdout (what `ttctl eval --lm-eval PATH` takes).
#
# Idempotent: a venv that already runs the pinned version is reused
# without touching the network. Destination:
# ${TT_LM_EVAL_VENV:-$HOME/.cache/tt-serving/lm-eval-0.4.13-venv}.
# Tests read the path from TT_LM_EVAL:
#   export TT_LM_EVAL="$(scripts/lm-eval.sh)"
set -euo pipefail

VERSION=0.4.13
VENV="${TT_LM_EVAL_VENV:-${HOME}/.cache/tt-serving/lm-eval-${VERSION}-venv}"
PY="${VENV}/bin/python"
BIN="${VENV}/bin/lm_eval"

installed() {
    [[ -x "${BIN}" ]] && "${PY}" -c "
import importlib.metadata as m, transformers, aiohttp, tenacity
assert m.version('lm-eval') == '${VERSION}'
" >/dev/null 2>&1
}

if installed; then
    echo "${BIN}"
    exit 0
fi

if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "lm-eval: 'python3 -m venv' is unavailable; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
mkdir -p "$(dirname "${VENV}")"
# --clear: a venv left half-made by an interrupted run starts over.
python3 -m venv --clear "${VENV}" >&2
if ! "${PY}" -m pip install --quiet --disable-pip-version-check \
    "lm-eval[api]==${VERSION}" transformers >&2; then
    echo "lm-eval: could not install lm-eval ${VERSION} and transformers from PyPI into ${VENV}; PyPI must be reachable" >&2
    exit 1
fi
if ! installed; then
    echo "lm-eval: ${VENV} was installed but does not run lm-eval ${VERSION}" >&2
    exit 1
fi
echo "${BIN}"
