#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once and print its path: the real
# OpenAI-compatible engine the `tt-worker-openai` tests and benchmarks run
# (it stands in for vLLM, which needs Tenstorrent cards).
#
# The sources are the llama.cpp that ships inside the PyPI sdist of
# llama-cpp-python (vendor/llama.cpp), pinned below. The build takes about
# 10 minutes on 2 cores; the binary is cached in
# ${TT_LLAMA_DIR:-$HOME/.cache/tt-serving/llama-server-<version>} and reused
# without touching the network. Needs cmake and a C++ compiler (CI installs
# cmake from Debian when missing). Typical use:
#   export TT_LLAMA_SERVER="$(scripts/llama-server.sh)"
set -euo pipefail

VERSION=0.3.36
DEST_DIR="${TT_LLAMA_DIR:-${HOME}/.cache/tt-serving/llama-server-${VERSION}}"
BIN="${DEST_DIR}/bin/llama-server"

if [[ -x "${BIN}" ]] && "${BIN}" --version >/dev/null 2>&1; then
    echo "${BIN}"
    exit 0
fi

if ! command -v cmake >/dev/null 2>&1; then
    echo "llama-server: cmake is missing; install it (apt-get install -y cmake)" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

echo "llama-server: fetching llama-cpp-python ${VERSION} sources from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --no-binary=llama-cpp-python \
    "llama-cpp-python==${VERSION}" -d "${work}" >"${work}/pip.log" 2>&1; then
    cat "${work}/pip.log" >&2
    echo "llama-server: could not download the llama-cpp-python sdist; PyPI must be reachable" >&2
    exit 1
fi
tar -xzf "${work}/llama_cpp_python-${VERSION}.tar.gz" -C "${work}"
src="${work}/llama_cpp_python-${VERSION}/vendor/llama.cpp"
[[ -f "${src}/CMakeLists.txt" ]] || {
    echo "llama-server: no llama.cpp sources under ${src}" >&2
    exit 1
}

echo "llama-server: building (about 10 minutes on 2 cores; log in ${work}/build.log)" >&2
# Static, so the cached binary needs nothing from the build tree.
if ! {
    cmake -S "${src}" -B "${work}/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DGGML_NATIVE=ON &&
        cmake --build "${work}/build" --target llama-server -j "${JOBS:-$(nproc)}"
} >"${work}/build.log" 2>&1; then
    tail -n 40 "${work}/build.log" >&2
    echo "llama-server: the build failed (log above)" >&2
    exit 1
fi

mkdir -p "${DEST_DIR}/bin"
cp "${work}/build/bin/llama-server" "${BIN}.part"
# Rename last so a concurrent reader never runs a half-copied binary.
mv -f "${BIN}.part" "${BIN}"
"${BIN}" --version >&2 || true
echo "${BIN}"
