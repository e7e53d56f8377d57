#!/usr/bin/env bash
# Make a Python with grpcio (the gRPC C-core client) for the test that talks
# to the daemon's sockets as a non-Rust client would. Prints the path of
# that Python on stdout.
#
# Idempotent: a venv that already imports grpc is reused without touching
# the network. Destination: ${TT_GRPCIO_VENV:-$HOME/.cache/tt-serving/grpcio-venv}.
# Tests read the path from TT_GRPCIO_PYTHON, so a typical use is:
#   export TT_GRPCIO_PYTHON="$(scripts/grpcio-python.sh)"
set -euo pipefail

VENV="${TT_GRPCIO_VENV:-${HOME}/.cache/tt-serving/grpcio-venv}"
PY="${VENV}/bin/python"

if [[ -x "${PY}" ]] && "${PY}" -c 'import grpc' >/dev/null 2>&1; then
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
if ! "${PY}" -m pip install --quiet --disable-pip-version-check grpcio >&2; then
    echo "grpcio-python: could not install grpcio from PyPI into ${VENV}; PyPI must be reachable" >&2
    exit 1
fi
"${PY}" -c 'import grpc' >&2
echo "${PY}"
