#!/usr/bin/env bash
# Real vLLM's 7B and the sim's h200-qwen2.5-7b profile through the same seeded sweep past saturation, side by side on
# cores of their own (docs/simulator.md, "Speed and fidelity"): scripts/saturation_trace.py against each, then
#   python scripts/saturation_trace.py --compare $OUT/real-7b.json $OUT/sim-7b.json
# Needs vLLM on the GPU machine (../shared/gpu/README.md: run this after its setup, with /tmp/models made) and the
# project's runtime dependencies on PYTHONPATH. Knobs (environment): RATES (20,28,36,44 requests/s), DURATION (25 s
# of arrivals a rate), DRAIN (35 s), KV_BYTES (17179869184: 16 GiB, the sim profile's budget), OUT (/tmp/trace).
set -u
cd "$(dirname "$0")/.."
RATES=${RATES:-20,28,36,44} DURATION=${DURATION:-25} DRAIN=${DRAIN:-35} KV_BYTES=${KV_BYTES:-17179869184}
OUT=${OUT:-/tmp/trace}
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT"
setsid taskset -c 0-9 python3 -m vllm.entrypoints.openai.api_server --model /tmp/models/qwen2.5-7b \
  --served-model-name qwen2.5-7b --load-format dummy --dtype bfloat16 --port 8003 --max-model-len 16384 \
  --kv-cache-memory-bytes "$KV_BYTES" --gpu-memory-utilization 0.3 --max-cudagraph-capture-size 128 \
  > "$OUT/vllm-7b.log" 2>&1 &
setsid taskset -c 12 python3 -m router.cli sim --port 9003 --profile h200-qwen2.5-7b > "$OUT/sim.log" 2>&1 &
until curl -sf localhost:9003/health >/dev/null; do sleep 1; done
taskset -c 13 python3 scripts/saturation_trace.py --url http://127.0.0.1:9003 --model qwen2.5-7b --rates "$RATES" \
  --duration "$DURATION" --drain "$DRAIN" --out "$OUT/sim-7b.json" > "$OUT/sim-trace.log" 2>&1 &
sim_trace=$!
t0=$(date +%s)
until curl -sf localhost:8003/health >/dev/null; do
  sleep 2; [ $(( $(date +%s) - t0 )) -gt 240 ] && { tail -30 "$OUT/vllm-7b.log"; exit 1; }
done
grep -m1 "KV cache" "$OUT/vllm-7b.log"
taskset -c 14 python3 scripts/saturation_trace.py --url http://127.0.0.1:8003 --model qwen2.5-7b --rates "$RATES" \
  --duration "$DURATION" --drain "$DRAIN" --out "$OUT/real-7b.json" 2>&1 | tee "$OUT/real-trace.log"
wait "$sim_trace"
python3 scripts/saturation_trace.py --compare "$OUT/real-7b.json" "$OUT/sim-7b.json"
pkill -f vllm.entrypoints; pkill -f "router.cli sim"
