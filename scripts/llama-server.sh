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

# Which instruction sets to build for. -march=native turns on AMX where the
# CPU advertises it, and on these machines AMX tile instructions fault:
# llama-server dies of SIGSEGV in ggml_backend_amx_mul_mat at the first
# decode (seen 2026-12-01 on an "Intel Xeon Processor" VM with amx_tile,
# amx_int8 and amx_bf16 in /proc/cpuinfo). So where cpuinfo lists AMX, the
# build names every other extension it lists instead (same code but the AMX
# kernels), and caches under its own name; elsewhere it stays native. On a
# host where AMX works this baseline is slower than it could be.
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { [[ " ${flags} " == *" $1 "* ]]; }
if has amx_tile; then
    FLAVOUR="-noamx"
    on() { if has "$1"; then echo "-D$2=ON"; else echo "-D$2=OFF"; fi; }
    ISA=(-DGGML_NATIVE=OFF
        "$(on avx GGML_AVX)" "$(on avx2 GGML_AVX2)" "$(on fma GGML_FMA)"
        "$(on f16c GGML_F16C)" "$(on bmi2 GGML_BMI2)" "$(on avx_vnni GGML_AVX_VNNI)"
        "$(on avx512f GGML_AVX512)" "$(on avx512vbmi GGML_AVX512_VBMI)"
        "$(on avx512_vnni GGML_AVX512_VNNI)" "$(on avx512_bf16 GGML_AVX512_BF16)"
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
else
    FLAVOUR=""
    ISA=(-DGGML_NATIVE=ON)
fi

DEST_DIR="${TT_LLAMA_DIR:-${HOME}/.cache/tt-serving/llama-server-${VERSION}${FLAVOUR}}"
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

echo "llama-server: building (about 10 minutes on 2 cores; ${ISA[*]}; log in ${work}/build.log)" >&2
# Static, so the cached binary needs nothing from the build tree.
if ! {
    cmake -S "${src}" -B "${work}/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        "${ISA[@]}" &&
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
