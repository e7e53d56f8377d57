#!/usr/bin/env bash
# Install the real Tenstorrent runtime from PyPI, ttnn 0.81.1 and tt-umd
# 0.9.14, into a venv and print the path of the venv's python on stdout. The
# tests run it with no card: ttnn in mock mode (TT_METAL_MOCK_CLUSTER_DESC_PATH
# pointing at tests/data/ttnn/p150-cluster.yaml) writes and loads
# tt_transformers-shaped tensor caches (tests/engines/vllm_standin.py with
# STANDIN_TT_CACHE_ENGINE=ttnn), and tt-umd's own chip lock is taken and
# released by tests/engines/umd_lock.py. Facts: docs/HARDWARE.md.
#
# ttnn 0.81.1 has wheels for CPython 3.10 and 3.12 only (x86_64, glibc 2.34
# or newer). The interpreter is the first that works of: python3.12 and
# python3.10 on PATH, then $PYENV_ROOT/versions/3.12.*/ and 3.10.*/ (default
# PYENV_ROOT ~/.pyenv), or TT_TTNN_BASE_PYTHON if set. ttnn needs numpy<2,
# pandas, loguru etc. but not torch; nothing here installs torch.
#
# Idempotent: a venv whose completion stamp names these versions is reused
# without touching the network. Destination:
# ${TT_TTNN_VENV:-$HOME/.cache/tt-serving/ttnn-0.81.1-venv} (about 700 MB,
# a few minutes to install). Tests read the path from TT_TTNN_PYTHON:
#   export TT_TTNN_PYTHON="$(scripts/ttnn.sh)"
set -euo pipefail

TTNN_VERSION=0.81.1
UMD_VERSION=0.9.14
VENV="${TT_TTNN_VENV:-${HOME}/.cache/tt-serving/ttnn-${TTNN_VERSION}-venv}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.tt-serving-complete"
WANT="ttnn==${TTNN_VERSION} tt-umd==${UMD_VERSION}"

# The import check: both packages import, at the pinned versions. Importing
# ttnn with no card and no mock descriptor only logs; it does not fail.
check() {
    "${PY}" - "${TTNN_VERSION}" "${UMD_VERSION}" <<'EOF'
import sys
from importlib.metadata import version
want_ttnn, want_umd = sys.argv[1], sys.argv[2]
import tt_umd  # noqa: F401
import ttnn  # noqa: F401
for dist, want in (("ttnn", want_ttnn), ("tt-umd", want_umd)):
    got = version(dist)
    if got != want:
        sys.exit(f"ttnn: {dist} is {got}, not {want}")
EOF
}

if [[ -x "${PY}" ]] && [[ -f "${STAMP}" ]] && [[ "$(cat "${STAMP}")" == "${WANT}" ]]; then
    echo "${PY}"
    exit 0
fi

# A usable base interpreter: it must run (a pyenv shim for a version that is
# not selected exits non-zero) and be 3.12 or 3.10.
usable() {
    "$1" -c 'import sys, venv; sys.exit(0 if sys.version_info[:2] in ((3, 12), (3, 10)) else 1)' >/dev/null 2>&1
}
BASE=""
candidates=()
[[ -n "${TT_TTNN_BASE_PYTHON:-}" ]] && candidates+=("${TT_TTNN_BASE_PYTHON}")
for name in python3.12 python3.10; do
    if command -v "${name}" >/dev/null 2>&1; then
        candidates+=("$(command -v "${name}")")
    fi
done
shopt -s nullglob
for dir in "${PYENV_ROOT:-${HOME}/.pyenv}"/versions/3.12.* "${PYENV_ROOT:-${HOME}/.pyenv}"/versions/3.10.*; do
    candidates+=("${dir}/bin/python3")
done
shopt -u nullglob
for c in "${candidates[@]}"; do
    if usable "${c}"; then
        BASE="${c}"
        break
    fi
done
if [[ -z "${BASE}" ]]; then
    echo "ttnn: ttnn ${TTNN_VERSION} needs CPython 3.12 or 3.10 (with the venv module), and none was found" \
        "(tried python3.12 and python3.10 on PATH and ${PYENV_ROOT:-${HOME}/.pyenv}/versions/3.12.*, 3.10.*);" \
        "install python3.12 and python3.12-venv (or python3.10), or set TT_TTNN_BASE_PYTHON" >&2
    exit 1
fi

mkdir -p "$(dirname "${VENV}")"
# --clear: a venv left half-made by an interrupted run starts over.
"${BASE}" -m venv --clear "${VENV}" >&2
# shellcheck disable=SC2086
if ! "${PY}" -m pip install --quiet --disable-pip-version-check ${WANT} >&2; then
    echo "ttnn: could not install ${WANT} from PyPI into ${VENV} (with ${BASE}); PyPI must be reachable" >&2
    exit 1
fi
if ! check >&2; then
    echo "ttnn: ${VENV}: 'import ttnn' or 'import tt_umd' failed after the install" >&2
    exit 1
fi
# Written last: a venv without it is rebuilt on the next run.
echo "${WANT}" >"${STAMP}"
echo "${PY}"
