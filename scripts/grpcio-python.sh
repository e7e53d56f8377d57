#!/usr/bin/env bash
# Make a Python with the real non-Rust clients the tests drive: grpcio (the
# gRPC C-core client, on the daemon's sockets) and the official `openai` SDK
# (on the OpenAI front door). Prints the path of that Python on stdout.
#
# Idempotent: a venv that already imports both is reused without touching
# the network. Destination: ${TT_GRPCIO_VENV:-$HOME/.cache/tt-serving/grpcio-venv}.
# Tests read the path from TT_GRPCIO_PYTHON, so a typical use is:
#   export TT_GRPCIO_PYTHON="$(scripts/grpcio-python.sh)"
set -euo pipefail

VENV="${TT_GRPCIO_VENV:-${HOME}/.cache/tt-serving/grpcio-venv}"
PY="${VENV}/bin/python"

if [[ -x "${PY}" ]] && "${PY}" -c 'import grpc, openai' >/dev/null 2>&1; then
    echo "${PY}"
    exit 0
fi

if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "grpcio-python: 'python3 -m venv' is unavailable; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
mkdir -p "$(dirname "${VENV}")"
# --clear: a venv left half-made by an interrupted run starts over.
python3 -m venv --clear "${VENV}" >&2
if ! "${PY}" -m pip install --quiet --disable-pip-version-check grpcio openai >&2; then
    echo "grpcio-python: could not install grpcio and openai from PyPI into ${VENV}; PyPI must be reachable" >&2
    exit 1
fi
"${PY}" -c 'import grpc, openai' >&2
echo "${PY}"
