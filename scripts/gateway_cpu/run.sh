#!/usr/bin/env bash
# Gateway CPU per proxied request (docs/BENCHMARKS.md, "the worker client's connection pool").
# A zero-latency worker and the load client on core 1, `chimera serve` alone on core 0; closed loop
# of N concurrent non-streamed chat requests for 5 s each; CPU from /proc/PID/stat, requests from
# the request log. Run from the repository root with the venv active.
set -euo pipefail
d=$(mktemp -d); here=$(cd "$(dirname "$0")" && pwd)
cat > "$d/cfg.yaml" <<YAML
gateway: {port: 18080, policy: least_outstanding, default_agent: chat, request_log: $d/req.jsonl}
backends:
  - {name: w, url: "http://127.0.0.1:18001", model: m, kv_budget_tokens: 100000}
agents:
  - {name: chat, models: [m]}
YAML
taskset -c 1 python "$here/worker.py" > /dev/null 2>&1 & W=$!
sleep 2
taskset -c 0 python -m router.cli serve --config "$d/cfg.yaml" > "$d/gw.log" 2>&1 & G=$!
sleep 3; touch "$d/req.jsonl"
for c in ${CONCURRENCY:-8 32 64}; do
  a=$(awk '{print $14+$15}' /proc/$G/stat); n0=$(wc -l < "$d/req.jsonl")
  taskset -c 1 python "$here/load.py" http://127.0.0.1:18080 5 "$c"
  sleep 1; b=$(awk '{print $14+$15}' /proc/$G/stat); n1=$(wc -l < "$d/req.jsonl")
  python3 -c "print(f'  concurrency $c: gateway CPU {($b-$a)*10/max($n1-$n0,1):.2f} ms per request ({$n1-$n0} requests)')"
done
kill -INT $G; sleep 1; kill $W; wait 2>/dev/null || true
