#!/usr/bin/env bash
# The overload benchmark's no-admission comparison (docs/OVERLOAD.md, "Priorities in the workers' queues") on real
# vLLM 0.26 on the lent H200. Run after the kit call (../shared/gpu/README.md), as call 2:
#   bash .gpu/bin/setup.sh; SEEDS="0 1" bash scripts/h200_overload.sh
# `chimera workers up` starts four 0.5B-shaped servers with the scenario's 4,096-token KV budget: two with
# `scheduling_policy: priority`, two without; then scripts/bench_overload.py runs each seed at 2x and 3x, with
# --speedup 1 (real time: the sim runs' rates x4, SLAs /4), on the fcfs pair and then on the priority pair.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/h200-out}; L=/tmp/vlog-ovl; mkdir -p "$OUT" "$L"; SEEDS=${SEEDS:-"0 1"}
. scripts/h200_site.sh; h200_wheels
h200_models
{
  echo "gateway: {host: 127.0.0.1, port: 8080, state: memory, policy: round_robin, default_agent: chat}"
  echo "backends:"
  for w in p0:8201:priority p1:8202:priority f0:8203:fcfs f1:8204:fcfs; do
    IFS=: read -r name port pol <<< "$w"
    echo "  - {name: $name, url: 'http://127.0.0.1:$port', model: qwen2.5-0.5b, kv_budget_tokens: 4096, max_model_len: 2048,"
    echo "     scheduling_policy: $pol, launch: {hf_model: /tmp/models/qwen2.5-0.5b, gpu: 0, kv_cache_gib: 0.046875,"
    echo "     extra_args: [--load-format, dummy, --dtype, bfloat16, --max-cudagraph-capture-size, '128']}}"
  done
  echo "agents: [{name: chat, models: [qwen2.5-0.5b]}]"
} > "$L/workers.yaml"
setsid python3 -m router.cli workers up --config "$L/workers.yaml" --log-dir "$L/workers" --timeout 300 > "$OUT/workers-up.log" 2>&1 &
for _ in $(seq 300); do
  ok=1; for port in 8201 8202 8203 8204; do curl -sf -m 2 "localhost:$port/health" > /dev/null || ok=0; done
  [ $ok = 1 ] && break; sleep 1
done
echo "workers up after $SECONDS s"; tail -6 "$OUT/workers-up.log"
for s in $SEEDS; do
  python3 scripts/bench_overload.py --multiples 2,3 --seeds "$s" --no-admission --speedup 1.0 --scheduling-policy fcfs \
    --urls http://127.0.0.1:8203,http://127.0.0.1:8204 --out "$OUT/real-fcfs-s$s.json" | tail -8
  python3 scripts/bench_overload.py --multiples 2,3 --seeds "$s" --no-admission --speedup 1.0 --scheduling-policy priority \
    --urls http://127.0.0.1:8201,http://127.0.0.1:8202 --out "$OUT/real-priority-s$s.json" | tail -8
  echo "seed $s done after $SECONDS s"
done
pkill -INT -f "router.cli workers up" 2>/dev/null; sleep 5
tar -C "$L" -czf "$OUT/logs.tgz" . 2>/dev/null
ls -la "$OUT"
