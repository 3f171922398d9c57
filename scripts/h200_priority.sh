#!/usr/bin/env bash
# vLLM's priority scheduling on the lent H200, against what the sim does (docs/OVERLOAD.md, "Priorities in the
# workers' queues"). Run after the kit call (../shared/gpu/README.md), as call 2:
#   bash .gpu/bin/setup.sh; bash scripts/h200_priority.sh
# 1. `chimera workers up` starts two 0.5B-shaped vLLM servers with --max-num-seqs 1, one with
#    `scheduling_policy: priority` (so the launcher's --scheduling-policy is exercised), one fcfs;
# 2. scripts/calibrate/priority_probe.py, REPS times on each: where an urgent request sent last finishes;
# 3. `chimera serve` in front of both: requests without a priority reach both workers (the priority one gets the
#    gateway's priority, the fcfs one none), through the openai SDK.
# Results under $OUT (default /tmp/h200-out).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/h200-out}; L=/tmp/vlog-prio; mkdir -p "$OUT" "$L"; REPS=${REPS:-3}
. scripts/h200_site.sh; h200_wheels
h200_models
cat > "$L/prio.yaml" <<'EOF'
gateway: {host: 127.0.0.1, port: 8080, state: memory, policy: round_robin, default_agent: chat}
backends:
  - name: prio
    url: http://127.0.0.1:8101
    model: qwen2.5-0.5b
    kv_budget_tokens: 174752
    max_model_len: 4096
    scheduling_policy: priority
    launch: {hf_model: /tmp/models/qwen2.5-0.5b, gpu: 0, kv_cache_gib: 2,
             extra_args: [--load-format, dummy, --dtype, bfloat16, --max-num-seqs, "1", --max-cudagraph-capture-size, "128"]}
  - name: fcfs
    url: http://127.0.0.1:8102
    model: qwen2.5-0.5b
    kv_budget_tokens: 174752
    max_model_len: 4096
    launch: {hf_model: /tmp/models/qwen2.5-0.5b, gpu: 0, kv_cache_gib: 2,
             extra_args: [--load-format, dummy, --dtype, bfloat16, --max-num-seqs, "1", --max-cudagraph-capture-size, "128"]}
agents:
  - {name: chat, models: [qwen2.5-0.5b], priority: 1}
EOF
setsid python3 -m router.cli workers up --config "$L/prio.yaml" --log-dir "$L/workers" --timeout 300 > "$OUT/workers-up.log" 2>&1 &
for _ in $(seq 300); do
  curl -sf -m 2 localhost:8101/health > /dev/null && curl -sf -m 2 localhost:8102/health > /dev/null && break; sleep 1
done
grep -h "scheduling.policy\|scheduling_policy" "$L"/workers/*.log 2>/dev/null | head -4 > "$OUT/launch-lines.txt"
grep -o "python3 -m vllm[^']*" "$OUT/workers-up.log" | head -2 >> "$OUT/launch-lines.txt"
for i in $(seq "$REPS"); do
  python3 scripts/calibrate/priority_probe.py --url http://127.0.0.1:8101 --model qwen2.5-0.5b --out "$L/real-priority-$i.json"
  python3 scripts/calibrate/priority_probe.py --url http://127.0.0.1:8102 --model qwen2.5-0.5b --no-priority \
    --out "$L/real-fcfs-$i.json"
done
python3 -c "import json, sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], 'w'), indent=1)" \
  "$OUT/real-probes.json" "$L"/real-*.json
setsid python3 -m router.cli serve --config "$L/prio.yaml" --port 8090 > "$L/gateway.log" 2>&1 &
G=$!
for _ in $(seq 60); do curl -sf -m 1 localhost:8090/ready > /dev/null && break; sleep 0.5; done
python3 - > "$OUT/gateway.txt" 2>&1 <<'EOF'
import openai
c = openai.OpenAI(base_url="http://127.0.0.1:8090/v1", api_key="none", max_retries=0, timeout=60)
for k in range(4):
    headers = {"x-priority": "3"} if k >= 2 else {}
    r = c.completions.with_raw_response.create(model="qwen2.5-0.5b", prompt="w1 w2 w3", max_tokens=4,
                                               extra_headers=headers)
    print(r.status_code, r.headers["x-chimera-backend"], headers, r.parse().usage.completion_tokens)
EOF
cat "$OUT/gateway.txt"
kill $G 2>/dev/null
pkill -INT -f "router.cli workers up" 2>/dev/null; sleep 5
tar -C "$L" -czf "$OUT/logs.tgz" . 2>/dev/null
ls -la "$OUT"
