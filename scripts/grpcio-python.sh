#!/usr/bin/env bash
# Make a Python with the real non-Rust clients the tests drive: grpcio (the
# gRPC C-core client, on the daemon's sockets), the official `openai` SDK
# (on the OpenAI front door) and `opentelemetry-proto` (the OTLP receiver of
# tests/traces.rs, served by grpcio). Prints the path of that Python on
# stdout.
#
# Idempotent: a venv that already imports all three is reused without
# touching the network; one made before the third was needed gets it added. Destination: ${TT_GRPCIO_VENV:-$HOME/.cache/tt-serving/grpcio-venv}.
# Tests read the path from TT_GRPCIO_PYTHON, so a typical use is:
#   export TT_GRPCIO_PYTHON="$(scripts/grpcio-python.sh)"
set -euo pipefail

VENV="${TT_GRPCIO_VENV:-${HOME}/.cache/tt-serving/grpcio-venv}"
PY="${VENV}/bin/python"

IMPORTS='import grpc, openai, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc'
if [[ -x "${PY}" ]] && "${PY}" -c "${IMPORTS}" >/dev/null 2>&1; then
    echo "${PY}"
    exit 0
fi
if [[ -x "${PY}" ]] && "${PY}" -c 'import grpc, openai' >/dev/null 2>&1 &&
    "${PY}" -m pip install --quiet --disable-pip-version-check opentelemetry-proto >&2 &&
    "${PY}" -c "${IMPORTS}" >/dev/null 2>&1; then
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
if ! "${PY}" -m pip install --quiet --disable-pip-version-check grpcio openai opentelemetry-proto >&2; then
    echo "grpcio-python: could not install grpcio, openai and opentelemetry-proto from PyPI into ${VENV}; PyPI must be reachable" >&2
    exit 1
fi
"${PY}" -c "${IMPORTS}" >&2
echo "${PY}"
