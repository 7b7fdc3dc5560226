#!/usr/bin/env bash
# Regenerate the lm-evaluation-harness sample files in this folder (README.md says why and how).
# Needs: the repo's .venv (make install) and .venv-lmeval with lm-eval 0.4.13:
#   python3.11 -m venv .venv-lmeval
#   .venv-lmeval/bin/pip install "torch==2.13.0" "lm-eval[hf]==0.4.13"
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
WORK=${WORK:-$(mktemp -d)}
GSM8K_TEST=${GSM8K_TEST:-$REPO/../shared/gsm8k/test.jsonl}
"$REPO/.venv/bin/python" "$HERE/make_tasks.py" "$WORK" "$GSM8K_TEST"
for arm in a b; do
  seed=$([ "$arm" = a ] && echo 0 || echo 1)
  # a tiny random Llama (hidden 32, 2 layers) with losslab's offline byte-level tokenizer
  "$REPO/.venv/bin/python" -c "from losslab.backends.local.tiny import make_tiny_model_dir; \
make_tiny_model_dir('$WORK/model_$arm', arch='llama', seed=$seed)"
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$REPO/.venv-lmeval/bin/lm_eval" run --model hf \
    --model_args "pretrained=$WORK/model_$arm,dtype=float32" --device cpu --batch_size 4 \
    --tasks tiny_gsm8k_mc,tiny_gsm8k_gen --include_path "$WORK/tasks" \
    --limit 20 --seed 0 --log_samples --output_path "$WORK/out_$arm"
  mkdir -p "$HERE/model_$arm"
  rm -f "$HERE/model_$arm"/samples_*.jsonl "$HERE/model_$arm"/results_*.json
  cp "$WORK/out_$arm"/*/samples_*.jsonl "$WORK/out_$arm"/*/results_*.json "$HERE/model_$arm/"
done
echo "fixtures written to $HERE/model_a and $HERE/model_b (work dir $WORK)"
