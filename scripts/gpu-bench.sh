#!/usr/bin/env bash
# The GPU benchmark in one command: Ember on wgpu beside PyTorch on CUDA on the same GPU, every table written to
# OUTDIR and gathered in OUTDIR/summary.md.
#
#   scripts/gpu-bench.sh [--quick] OUTDIR
#
# Sections (each writes its tables to OUTDIR; every command runs under a time limit, and the full run as a whole
# within EMBER_BENCH_BUDGET seconds, default 570, so that it fits a 10-minute slot on a GPU machine):
#   devices     `ember devices`, nvidia-smi
#   attention   `ember --device wgpu bench attention`: Ember's kernels (each tier), Burn's built-in and the naive path, causal,
#               8 heads at T 512..16384 and d 64, 32 heads at T 1024 and 4096 and d 64 and 128, batch 1 (each row's
#               output and gradient checked against an f64 reference; paths whose T×T scores exceed the adapter's
#               storage-binding limit are listed as not run)
#               and in f16: the tiers with f16 tiles over f32 inputs, then every path on f16 inputs (32 heads, T 1024
#               and 4096, d 64)
#   pytorch     scripts/reference/attention.py on CUDA for the same shapes: SDPA in f32 and bf16, naive f32
#   train       `ember --device wgpu bench train`: llama-tiny at block 1024 with Ember's attention and the naive
#               path, and in f16 (f32 master weights, loss scaling); GPT-2 124M at batch 8 × 1024 in f32 and f16
#               beside PyTorch on CUDA (f32 and bf16 autocast)
#   decode      SmolLM2-135M's shape with random weights: prefill and decode tokens/s on wgpu beside transformers
#               on CUDA, in f32 and in f16 (transformers in bf16)
# PyTorch sections are skipped, with a line saying why, when python3 has no torch with CUDA. summary.md holds every
# table, the machine (nvidia-smi -L, `ember devices`), the ember build, each section's status and time, and the
# commands; stderr.log holds the commands' error output.
#
# --quick runs every section at tiny sizes (a minute or two on lavapipe, Mesa's software Vulkan) and stops at the
# first failure; the full run records a failed section in summary.md, goes on, and exits non-zero at the end.
#
# The machine needs no Rust toolchain and no network. The ember binary is $EMBER when set, else gpu/ember.xz
# (written by scripts/gpu-pack.sh, with the Vulkan loader's packages in gpu/debs), else the debug build in
# /var/tmp/ember-target. gpu/debs is unpacked into a temporary prefix only when the system has no libvulkan.so.1.
# EMBER_BENCH_PYTHON (default python3) is the Python with torch and transformers; EMBER_BENCH_TORCH_DEVICE (default
# cuda) the device the references run on (cpu to try them without a GPU); EMBER_BENCH_PEAK_GFLOPS the FP32 peak that
# the attention tables compare with (default: 67,000 on an H200 or H100 SXM, NVIDIA's datasheet figure).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/gpu-bench.sh [--quick] OUTDIR" >&2; exit 2; }
quick=0
case "${1:-}" in
  --quick) quick=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
if [ $# -ne 1 ] || [ "${1:0:1}" = - ]; then usage; fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
: >"$out/commands.txt"
: >"$out/stderr.log"
work="$(mktemp -d)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" PYTHONUNBUFFERED=1
py="${EMBER_BENCH_PYTHON:-python3}"
torch_device="${EMBER_BENCH_TORCH_DEVICE:-cuda}"

# Time limits in seconds, per command, and for the full run as a whole (EMBER_BENCH_BUDGET, default 9.5 minutes):
# a command gets at most what is left of the budget, and none starts with less than 10 s left. On an H200 each
# attention measurement (a child process: device start, shader compilation, autotuning, timing, the reference check)
# takes about 5 s.
if [ "$quick" = 1 ]; then
  t_devices=60 t_attention=300 t_f16=300 t_gemm=300 t_pytorch=300 t_train=300 t_decode=300 budget=0
else
  t_devices=30 t_attention=90 t_attention_main=130 t_dq=60 t_f16=50 t_gemm=40 t_pytorch=60 t_train=40 t_gpt2=100
  t_decode=80
  budget="${EMBER_BENCH_BUDGET:-570}"
fi

# --- bookkeeping: what ran, how it went, and summary.md whatever happens -----------------------------------------

tables=()    # the files summary.md gathers, in order
statuses=()  # "| section | status | seconds |" rows
failures=0
section_name="" section_start=0 section_notes=""

begin() {
  section_name=$1 section_start=$SECONDS section_notes=""
  echo
  echo "=== $section_name"
}

# fail REASON: the current section failed; quick mode stops here.
fail() {
  echo "FAILED: $section_name: $1" >&2
  section_notes="${section_notes:+$section_notes; }$1"
  if [ "$quick" = 1 ]; then
    end
    exit 1
  fi
}

# skip REASON: a section that cannot run here (no CUDA for PyTorch, say); not a failure.
skip() {
  echo "skipped: $1"
  section_notes="${section_notes:+$section_notes; }skipped: $1"
}

end() {
  [ -n "$section_name" ] || return 0
  local status=ok
  case "$section_notes" in
    "") ;;
    skipped:*) status="$section_notes" ;;
    *) status="FAILED: $section_notes"; failures=$((failures + 1)) ;;
  esac
  statuses+=("| $section_name | $status | $((SECONDS - section_start)) |")
  section_name=""
}

# run LIMIT FILE CMD...: CMD under a time limit, its output appended to FILE (and shown), its stderr to
# OUTDIR/stderr.log; the command is recorded in OUTDIR/commands.txt. A failure or timeout is the section's failure.
run() {
  local limit=$1 file=$2 rc=0 left
  shift 2
  if [ "$budget" != 0 ]; then
    left=$((budget - SECONDS))
    if [ "$left" -lt 10 ]; then
      fail "\`$*\` not run: the time budget of ${budget} s is spent"
      return 1
    fi
    [ "$limit" -le "$left" ] || limit=$left
  fi
  echo "$*" >>"$out/commands.txt"
  echo "\$ $*" | tee -a "$out/stderr.log"
  # In a markdown file the command heads its output: a shell line inside a code block, else a code span.
  if [ "$(tail -n 1 "$file" 2>/dev/null)" = '```text' ]; then
    echo "\$ $*" >>"$file"
  elif [[ "$file" == *.md ]]; then
    printf '%s\n\n' "\`$*\`" >>"$file"
  fi
  timeout -k 10 "$limit" "$@" 2>"$work/stderr" | tee -a "$file" || rc=$?
  cat "$work/stderr" >>"$out/stderr.log"
  case $rc in
    0) return 0 ;;
    124 | 137) fail "\`$*\` timed out after ${limit} s (its table holds the rows it finished)" ;;
    *) fail "\`$*\` exited with status $rc: $(grep -v '^ *$' "$work/stderr" | tail -n 1 | cut -c1-200)" ;;
  esac
  return 1
}

# expect FILE REGEX WHAT: FILE must hold a line matching REGEX (grep -E), else the section failed.
expect() {
  grep -Eq "$2" "$1" || fail "$(basename "$1") holds no $3"
}

# heading FILE TITLE TEXT: starts a section's table file.
heading() {
  printf '## %s\n\n%s\n\n' "$2" "$3" >"$1"
  tables+=("$1")
}

summary() {
  local rc=$?
  [ "$rc" = 0 ] || [ -z "$section_name" ] || section_notes="${section_notes:+$section_notes; }the script stopped (exit $rc)"
  end
  [ "$rc" = 0 ] || [ "$failures" -gt 0 ] || failures=1
  {
    echo "# Ember GPU benchmark$([ "$quick" = 1 ] && echo " (--quick)")"
    echo
    echo "Started $started, finished $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)."
    echo
    echo '```text'
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L 2>&1 || true; else echo "nvidia-smi: not found"; fi
    [ -f "$out/devices.txt" ] && cat "$out/devices.txt"
    echo "ember: ${ember_origin:-not found}"
    [ -n "${loader_note:-}" ] && echo "$loader_note"
    echo '```'
    echo
    echo "| section | status | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${statuses[@]}"
    echo
    for f in "${tables[@]}"; do
      [ -f "$f" ] && cat "$f" && echo
    done
    echo "## Commands"
    echo
    echo '```sh'
    cat "$out/commands.txt"
    echo '```'
  } >"$out/summary.md"
  rm -rf "$work"
  echo
  echo "summary: $out/summary.md ($failures failed section(s))"
  [ "$failures" = 0 ] || exit 1
}
trap summary EXIT

# --- the ember binary and the Vulkan loader --------------------------------------------------------------------

mkdir -p "$work/bin"
if [ -n "${EMBER:-}" ]; then
  ln -s "$(realpath "$EMBER")" "$work/bin/ember"
  ember_origin="$EMBER"
elif [ -f gpu/ember.xz ]; then
  xz -dc gpu/ember.xz >"$work/bin/ember"
  chmod +x "$work/bin/ember"
  ember_origin="gpu/ember.xz, $(grep -E '^(commit|packed):' gpu/manifest.txt 2>/dev/null | paste -sd '|' - | sed 's/|/; /g' || echo 'no manifest')"
else
  ln -s /var/tmp/ember-target/debug/ember "$work/bin/ember"
  ember_origin="/var/tmp/ember-target/debug/ember"
fi
[ -x "$work/bin/ember" ] || { echo "error: no ember binary (set EMBER or run scripts/gpu-pack.sh)" >&2; exit 1; }
if [[ "$ember_origin" != gpu/* ]] && git rev-parse HEAD >/dev/null 2>&1; then
  ember_origin="$ember_origin, checkout at $(git rev-parse --short HEAD)"
fi
export PATH="$work/bin:$PATH"

ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
if ! "$ldconfig" -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null; then
  if compgen -G "gpu/debs/*.deb" >/dev/null; then
    for deb in gpu/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
    export LD_LIBRARY_PATH="$work/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    loader_note="no libvulkan.so.1 on the system: the loader from gpu/debs is on LD_LIBRARY_PATH"
  else
    loader_note="no libvulkan.so.1 on the system and no gpu/debs (scripts/gpu-pack.sh downloads it)"
  fi
fi
# NVIDIA's driver ships its Vulkan ICD; when no ICD manifest in the usual places names it, point the loader at it.
nvidia=/usr/local/nvidia
if [ -f $nvidia/share/vulkan/icd.d/nvidia_icd.json ] && [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] &&
  ! grep -qsl nvidia /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; then
  export VK_DRIVER_FILES=$nvidia/share/vulkan/icd.d/nvidia_icd.json VK_ICD_FILENAMES=$nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f $nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ] &&
    export __EGL_VENDOR_LIBRARY_FILENAMES=$nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  loader_note="${loader_note:+$loader_note; }VK_DRIVER_FILES=$VK_DRIVER_FILES"
fi
for lib in $nvidia/lib64 $nvidia/lib; do
  if [ -d "$lib" ] && [[ ":${LD_LIBRARY_PATH:-}:" != *":$lib:"* ]]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib"
  fi
done

peak="${EMBER_BENCH_PEAK_GFLOPS:-}"
if [ -z "$peak" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -E 'H200|H100 80GB HBM3' >/dev/null; then
  peak=67000 # FP32, NVIDIA's H100 / H200 SXM datasheet
fi

# A Python whose torch reaches the reference device (CUDA unless EMBER_BENCH_TORCH_DEVICE says otherwise).
torch_ok() {
  if [ "$torch_device" = cpu ]; then
    "$py" -c 'import torch' 2>/dev/null
  else
    "$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null
  fi
}
if [ "$torch_device" = cpu ]; then
  torch_why="$py has no torch"
else
  torch_why="$py has no torch with CUDA (\`$py -c 'import torch; assert torch.cuda.is_available()'\` fails)"
fi

# --- devices ---------------------------------------------------------------------------------------------------

begin devices
run "$t_devices" "$out/devices.txt" ember devices || true
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || fail "nvidia-smi failed"
fi
gpu=1
if [ "$quick" = 1 ]; then
  expect "$out/devices.txt" '^wgpu ' "wgpu adapter"
elif ! grep -Eq '^wgpu .*\| (DiscreteGpu|IntegratedGpu|VirtualGpu) \|' "$out/devices.txt"; then
  gpu=0
  fail "wgpu finds no GPU adapter (see devices.txt and stderr.log); the wgpu sections are left out"
fi
end

# --- attention -------------------------------------------------------------------------------------------------

# "HEADS BATCH LENGTHS DIMS" per table: the main table first (the long sequences), then many heads.
if [ "$quick" = 1 ]; then
  tables_attention=("2 1 64,128 64") iters=1 calls=1
else
  tables_attention=("8 1 512,1024,2048,4096,8192,16384 64" "32 1 1024,4096 64,128") iters=3 calls=2
fi

begin attention
if [ "$gpu" = 1 ]; then
  for table in "${tables_attention[@]}"; do
    read -r h b lengths dims <<<"$table"
    file="$out/attention-h$h-b$b.md"
    heading "$file" "Attention on wgpu: $h heads, batch $b" \
      "Causal, f32; Ember's WGSL kernels in each tier the adapter runs (portable; subgroup), Burn's built-in (burn) and the materialised T×T path (naive)."
    args=(--lengths "$lengths" --head-dims "$dims" --heads "$h" --batch "$b" --iters "$iters" --calls "$calls")
    [ -z "$peak" ] || args+=(--peak-gflops "$peak")
    limit=$t_attention
    [ "$table" != "${tables_attention[0]}" ] || limit=${t_attention_main:-$t_attention}
    run "$limit" "$file" ember --device wgpu bench attention "${args[@]}" || continue
    for impl in portable burn naive; do expect "$file" "^\| [0-9]+ \| [0-9]+ \| $impl \| [0-9.]+ " "timed $impl row"; done
    if [ "$quick" = 1 ] && grep -q "failed:" "$file"; then fail "a measurement failed in $(basename "$file")"; fi
  done
  if [ "$quick" = 0 ]; then
    file="$out/attention-dq.md"
    heading "$file" "The backward's dq folded into the dk/dv pass (f32 atomic adds) or in a pass of its own (2pass)" \
      "8 heads, batch 1, d 64, causal, f32; the forward columns run the same kernel."
    run "$t_dq" "$file" ember --device wgpu bench attention --lengths 1024,4096 --head-dims 64 --heads 8 \
      --iters "$iters" --calls "$calls" --impls subgroup,subgroup-2pass,portable,portable-2pass || true
  fi
  # f16: the tiers with f16 tiles over f32 inputs beside their f32 selves, then every path on f16 inputs.
  if [ "$quick" = 1 ]; then f16=(--lengths 64,128 --heads 2); else f16=(--lengths 1024,4096 --heads 32); fi
  f16+=(--head-dims 64 --iters "$iters" --calls "$calls")
  [ -z "$peak" ] || f16+=(--peak-gflops "$peak")
  # The cooperative-matrix forward where the adapter offers 16×16 f16 → f32 products (`ember devices` says so).
  coop=""
  ! grep -q 'attention forward on 16×16 f16 → f32' "$out/devices.txt" || coop=",cooperative"
  file="$out/attention-f16.md"
  heading "$file" "Attention in f16 on wgpu" \
    "Causal, d 64, batch 1. First f32 inputs, each tier with f32 and with f16 tiles (portable-f16, subgroup-f16) and, where the adapter offers 16×16 f16 cooperative matrices, the cooperative-matrix forward (cooperative); then f16 inputs (Ember's tiers, whose tiles are then f16, Burn's built-in and the naive path, all on f16 tensors). Arithmetic in Ember's tiered kernels stays f32, the cooperative products take f16 and accumulate in f32; the percentages are of the FP32 peak."
  if run "$t_f16" "$file" ember --device wgpu bench attention "${f16[@]}" \
    --impls "portable,portable-f16,subgroup,subgroup-f16$coop"; then
    expect "$file" '^\| [0-9]+ \| [0-9]+ \| portable-f16 \| [0-9.]+ ' "timed portable-f16 row"
  fi
  if run "$t_f16" "$file" ember --device wgpu bench attention "${f16[@]}" --dtype f16 --impls "portable,subgroup$coop,burn,naive"; then
    expect "$file" 'causal, f16;' "f16-input table"
  fi
  if [ "$quick" = 1 ] && grep -q "failed:" "$file"; then fail "a measurement failed in $(basename "$file")"; fi
else
  skip "no GPU adapter"
fi
end

# --- gemm ------------------------------------------------------------------------------------------------------

# Matrix products alone: Burn's matmul (f32, f16) and Ember's cooperative-matrix GEMM on wgpu, torch.matmul (f32
# with TF32 off, bf16, f16) on the same GPU; % peak of the f16 tensor peak (EMBER_BENCH_PEAK_F16_GFLOPS).
peak16="${EMBER_BENCH_PEAK_F16_GFLOPS:-}"
if [ -z "$peak16" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -E 'H200|H100 80GB HBM3' >/dev/null; then
  peak16=989000 # dense FP16/BF16 tensor, NVIDIA's H100 / H200 SXM datasheet
fi
if [ "$quick" = 1 ]; then
  gemm=(--shapes 64x64x64,100x37x300 --iters 1 --calls 1)
else
  gemm=(--shapes 1024x1024x1024,4096x4096x4096,8192x768x2304,8192x768x3072,8192x3072x768 --iters 5 --calls 4)
fi
[ -z "$peak16" ] || gemm+=(--peak-gflops "$peak16")
begin gemm
file="$out/gemm.md"
heading "$file" "Matrix products on the GPU" \
  "C = A B. Burn's matmul in f32 and f16 and Ember's cooperative-matrix GEMM (f16 operands, f32 accumulators) on wgpu, where the adapter offers the matrices; then torch.matmul in f32 (TF32 off), bf16 and f16. The percentages are of the dense f16 tensor peak."
if [ "$gpu" = 1 ]; then
  run "$t_gemm" "$file" ember --device wgpu bench gemm "${gemm[@]}" && expect "$file" '\| burn f32 \| [0-9.]+ ' "timed burn f32 row"
else
  skip "no GPU adapter"
fi
if torch_ok; then
  run "$t_gemm" "$file" "$py" scripts/reference/matmul.py --device "$torch_device" "${gemm[@]}" || true
else
  printf 'PyTorch skipped: %s.\n\n' "$torch_why" >>"$file"
fi
end

begin pytorch
file="$out/pytorch-attention.md"
heading "$file" "Attention in PyTorch on $torch_device" \
  "The same shapes: SDPA in f32 and bf16, and softmax(QKᵀ/√d + mask)V with plain f32 tensor ops (TF32 off)."
if torch_ok; then
  if [ "$quick" = 1 ]; then
    args=(--batch 1 --heads 2 --lengths "64,128" --head-dims 64 --iters 1 --calls 1)
  else
    args=(--batch 1 --heads "8,32" --lengths 512,1024,2048,4096,8192,16384 --head-dims "64,128" --iters 3 --calls 2
      --max-bht2 $((8 * 16384 * 16384)))
  fi
  run "$t_pytorch" "$file" "$py" scripts/reference/attention.py --device "$torch_device" "${args[@]}" &&
    for impl in sdpa-f32 sdpa-bf16 naive-f32; do expect "$file" "^attention impl=$impl .* fwd_ms=[0-9]" "$impl figure"; done
else
  skip "$torch_why"
  echo "Skipped: $torch_why." >>"$file"
fi
end

# --- training --------------------------------------------------------------------------------------------------

corpus=(--set data.corpus=tests/fixtures/shakespeare-100k.txt) # data/ is not part of the checkout
if [ "$quick" = 1 ]; then
  llama=(--set model.block_size=64 --set train.batch_size=2 --steps 2 --warmup 1 --rounds 1)
  gpt2=(--set model.n_layers=1 --set model.n_heads=2 --set model.d_model=64 --set model.block_size=64
    --set model.vocab_size=512 --set data.vocab_size=512 --set train.batch_size=2 --set train.grad_accum=1
    --steps 2 --warmup 1 --rounds 1)
  t_gpt2=$t_train
else
  llama=(--set model.block_size=1024 --steps 10 --warmup 3 --rounds 1)
  gpt2=(--set train.batch_size=8 --set model.block_size=1024 --set train.grad_accum=1 --steps 4 --warmup 2 --rounds 1)
fi

begin train
if [ "$gpu" = 1 ]; then
  # Quick mode leaves out the naive path here: the attention section already runs it.
  rows=("auto f32" "auto f16")
  [ "$quick" = 1 ] || rows+=("naive f32")
  for row in "${rows[@]}"; do
    read -r attention dtype <<<"$row"
    file="$out/train-llama-tiny-$attention$([ "$dtype" = f32 ] || echo "-$dtype").md"
    heading "$file" "Training llama-tiny on wgpu, attention $attention, $dtype" \
      "configs/llama-tiny.toml (0.8 M parameters, RMSNorm, RoPE, GQA 4/2, SwiGLU) at block ${llama[1]#model.block_size=}; \
tokens/s, and the device memory the pools hold. f16: forward and backward in f16, f32 master weights and AdamW \
moments, dynamic loss scaling."
    echo '```text' >>"$file"
    run "$t_train" "$file" ember --device wgpu bench train --config configs/llama-tiny.toml "${corpus[@]}" "${llama[@]}" \
      --attention "$attention" --set model.dtype="$dtype" && expect "$file" '^ember median: [0-9]+ tokens/s' "Ember tokens/s" &&
      expect "$file" '^ember device memory: [0-9.]+ MiB' "Ember device memory"
    echo '```' >>"$file"
  done
  file="$out/train-gpt2-124m.md"
  heading "$file" "Training GPT-2 124M on wgpu beside PyTorch" \
    "configs/gpt2-124m.toml (BPE over the committed Shakespeare slice, the model's 50,257-token vocabulary) at batch \
8 × block 1024, one micro-batch per step; PyTorch trains the same model, optimizer and batches, f32 with TF32 off \
and bf16 autocast, eager."
  pytorch=()
  if torch_ok; then
    pytorch=(--pytorch "$py" --pytorch-device "$torch_device" --pytorch-dtype "f32,bf16")
  else
    printf 'PyTorch skipped: %s.\n\n' "$torch_why" >>"$file"
  fi
  echo '```text' >>"$file"
  if run "$t_gpt2" "$file" ember --device wgpu bench train --config configs/gpt2-124m.toml "${corpus[@]}" "${gpt2[@]}" \
    "${pytorch[@]}"; then
    expect "$file" '^ember median: [0-9]+ tokens/s' "Ember tokens/s"
    expect "$file" '^ember device memory: [0-9.]+ MiB' "Ember device memory"
    [ ${#pytorch[@]} = 0 ] || expect "$file" '^pytorch bf16 median: [0-9]+ tokens/s' "PyTorch tokens/s"
  fi
  echo '```' >>"$file"
  if [ "$quick" = 0 ]; then
    printf '\nEmber in f16 (f32 master weights and AdamW moments, dynamic loss scaling), beside the bf16 autocast row above:\n\n' >>"$file"
    echo '```text' >>"$file"
    run "$t_gpt2" "$file" ember --device wgpu bench train --config configs/gpt2-124m.toml "${corpus[@]}" "${gpt2[@]}" \
      --set model.dtype=f16 && expect "$file" '^bench train: .* in f16 on' "Ember f16 training"
    echo '```' >>"$file"
  fi
else
  skip "no GPU adapter"
fi
end

# --- decoding --------------------------------------------------------------------------------------------------

begin decode
file="$out/decode.md"
if [ "$quick" = 1 ]; then
  decode=(--config configs/llama-tiny.toml --prompt-tokens 8 --lengths 4 --rounds 1)
else
  decode=(--config configs/smollm2-135m.toml --prompt-tokens 512 --lengths 128 --rounds 2)
fi
if [ "$gpu" = 1 ]; then
  heading "$file" "Prefill and decoding on wgpu beside transformers, random weights" \
    "The shape of ${decode[1]} with random weights on both sides: SmolLM2-135M's real checkpoint (93 MB GGUF, 270 MB \
safetensors) does not travel with the checkout to a GPU machine, and speed does not depend on the weights' values. \
Greedy, KV cache, ${decode[3]}-token prompt, ${decode[5]} new tokens; transformers builds LlamaForCausalLM of \
the same shape on $torch_device."
  echo '```text' >>"$file"
  run 30 "$file" ember inspect --config configs/smollm2-135m.toml && expect "$file" 'total +134,515,008' "parameter count"
  echo '```' >>"$file"
  reference=()
  if ! torch_ok; then
    printf 'transformers skipped: %s.\n\n' "$torch_why" >>"$file"
  elif ! "$py" -c 'import transformers' 2>/dev/null; then
    printf 'transformers skipped: %s has no transformers.\n\n' "$py" >>"$file"
  else
    reference=(--transformers "$py" --transformers-device "$torch_device")
  fi
  for dtype in f32 f16; do
    printf '\n%s (transformers in %s):\n\n' "$dtype" "$([ "$dtype" = f32 ] && echo f32 || echo bf16)" >>"$file"
    half=()
    [ "$dtype" = f32 ] || half=(--dtype f16 $([ ${#reference[@]} = 0 ] || echo --transformers-dtype bf16))
    run "$t_decode" "$file" ember --device wgpu bench decode "${decode[@]}" "${reference[@]}" "${half[@]}" &&
      if [ ${#reference[@]} = 0 ]; then
        expect "$file" '^\| [0-9]+ \| [0-9.]+ \|' "cached tokens/s"
      else
        expect "$file" '^\| Ember \| [0-9.]+ s \| [0-9.]+ \| [0-9.]+ \|' "Ember prefill and decode tokens/s"
        expect "$file" '^\| transformers \| [0-9.]+ s \|' "transformers figures"
      fi
  done
else
  skip "no GPU adapter"
fi
end
