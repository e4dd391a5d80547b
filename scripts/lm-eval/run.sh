#!/usr/bin/env bash
# lm-evaluation-harness against `ember serve` and against transformers on the same model, side by side: a local
# multiple-choice task of 300 items built from the committed Shakespeare slice (scripts/lm-eval/task.py), scored by
# `lm_eval --model local-completions` (Ember's completions `echo` + `logprobs`, its /tokenizer_info and /tokenize
# as the remote tokenizer) and by `lm_eval --model hf` (the GGUF dequantized to f32 by transformers), then compared
# item by item (scripts/lm-eval/compare.py: per-choice log-likelihoods within 1e-3, the same answers).
#
#   scripts/lm-eval/run.sh PYTHON [GGUF]      PYTHON has lm_eval[api]==0.4.13, torch, transformers, accelerate, gguf
#
# GGUF defaults to the SmolLM2-135M-Instruct Q4_1 file (scripts/prepare-data.sh smollm2); Ember serves it with
# --weights f32, as transformers runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${1:?usage: scripts/lm-eval/run.sh PYTHON [GGUF]}
gguf=${2:-data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || scripts/prepare-data.sh smollm2
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
"$python" scripts/lm-eval/task.py tests/fixtures/shakespeare-100k.txt "$work/task"
cargo build -q -p ember
target=$(cargo metadata --no-deps --format-version 1 | "$python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
"$target/debug/ember" serve --device cpu --model "$gguf" --weights f32 --port 0 --name smollm2 >"$work/serve.log" &
server=$!
until grep -q "http://" "$work/serve.log" 2>/dev/null; do sleep 0.2; done
address=$(grep -o "http://[^;]*" "$work/serve.log" | head -1)
until curl -sf "$address/health" >/dev/null; do sleep 0.2; done
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
common=(--tasks ember_shakespeare_mc --include_path "$work/task" --log_samples)
start=$(date +%s)
"$python" -m lm_eval --model local-completions \
  --model_args "model=smollm2,base_url=$address/v1/completions,tokenizer_backend=remote,num_concurrent=1,max_retries=1" \
  "${common[@]}" --output_path "$work/ember"
ember_s=$(( $(date +%s) - start )); start=$(date +%s)
"$python" -m lm_eval --model hf \
  --model_args "pretrained=$(dirname "$gguf"),gguf_file=$(basename "$gguf"),dtype=float32" --device cpu \
  "${common[@]}" --output_path "$work/hf"
hf_s=$(( $(date +%s) - start ))
echo "wall time: lm_eval local-completions against ember serve ${ember_s}s, lm_eval hf ${hf_s}s"
"$python" scripts/lm-eval/compare.py "$work/hf" "$work/ember" 1e-3
