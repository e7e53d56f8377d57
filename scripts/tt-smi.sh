#!/usr/bin/env bash
# Install the real tt-smi 6.8.0 (PyPI, with tt-umd 0.9.12 and pyluwen) into a
# venv and print the path of its `tt-smi` on stdout. The tests run it, with
# no card, to check that every reset command the daemon can build is one
# tt-smi 6.8 takes as meant (full PCI addresses, never "every card"), and
# that the fake tt-smi answers each argument form as the real one does.
#
# Idempotent: a venv whose tt-smi already reports 6.8.0 is reused without
# touching the network. Destination:
# ${TT_SMI_VENV:-$HOME/.cache/tt-serving/tt-smi-6.8.0-venv} (about 60 MB,
# under a minute to install). Tests read the path from TT_SMI_REAL:
#   export TT_SMI_REAL="$(scripts/tt-smi.sh)"
set -euo pipefail

VERSION=6.8.0
VENV="${TT_SMI_VENV:-${HOME}/.cache/tt-serving/tt-smi-${VERSION}-venv}"
SMI="${VENV}/bin/tt-smi"

if [[ -x "${SMI}" ]] && [[ "$("${SMI}" -v 2>/dev/null)" == "${VERSION}" ]]; then
    echo "${SMI}"
    exit 0
fi

if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "tt-smi: 'python3 -m venv' is unavailable; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
mkdir -p "$(dirname "${VENV}")"
# --clear: a venv left half-made by an interrupted run starts over.
python3 -m venv --clear "${VENV}" >&2
if ! "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check "tt-smi==${VERSION}" >&2; then
    echo "tt-smi: could not install tt-smi==${VERSION} from PyPI into ${VENV}; PyPI must be reachable" >&2
    exit 1
fi
got="$("${SMI}" -v)"
if [[ "${got}" != "${VERSION}" ]]; then
    echo "tt-smi: ${SMI} -v says ${got}, not ${VERSION}" >&2
    exit 1
fi
echo "${SMI}"
