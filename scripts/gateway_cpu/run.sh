#!/usr/bin/env bash
# Gateway CPU per proxied request (docs/BENCHMARKS.md, "the worker client's connection pool").
# The zero-latency worker (router.bench.fastworker) and the load client on core 1, `chimera serve`
# alone on core 0; closed loop of N concurrent chat requests for 5 s each, non-streamed and then
# streamed (8 SSE events); CPU from /proc/PID/stat, requests from the request log.
# Run from the repository root with the venv active. CONCURRENCY="8 32 64" and MODES="json stream"
# pick the cells; GATEWAY_SRC=DIR runs the gateway from another checkout of the repository (an A/B);
# PYSPY=FILE samples the gateway with py-spy (not a dependency: pip install py-spy) over every cell,
# and `python scripts/gateway_cpu/shares.py FILE` sums the samples by layer.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GW_PORT=18080 W_PORT=18001; . "$here/fleet.sh" taskset -c 1
sleep 2
(cd "${GATEWAY_SRC:-.}" && exec taskset -c 0 ${PYTHON:-python} -m router.cli serve --config "$d/cfg.yaml") > "$d/gw.log" 2>&1 & G=$!
sleep 3; touch "$d/req.jsonl"
if [ -n "${PYSPY:-}" ]; then
  cells=$(( $(wc -w <<< "${MODES:-json stream}") * $(wc -w <<< "${CONCURRENCY:-8 32 64}") ))
  taskset -c 1 py-spy record -p $G -d $(( cells * 6 )) -r 200 -f raw -o "$PYSPY" --nonblocking > /dev/null 2>&1 & P=$!
fi
for mode in ${MODES:-json stream}; do
  for c in ${CONCURRENCY:-8 32 64}; do
    a=$(awk '{print $14+$15}' /proc/$G/stat); n0=$(wc -l < "$d/req.jsonl")
    rate=$(taskset -c 1 ${PYTHON:-python} "$here/load.py" http://127.0.0.1:18080 5 "$c" "$mode")
    sleep 1; b=$(awk '{print $14+$15}' /proc/$G/stat); n1=$(wc -l < "$d/req.jsonl")
    python3 -c "print(f'  $mode concurrency $c: gateway CPU {($b-$a)*10/max($n1-$n0,1):.2f} ms per request ({$n1-$n0} requests; $rate)')"
  done
done
if [ -n "${P:-}" ]; then wait $P || true; fi
kill -INT $G; sleep 1; kill $W; wait 2>/dev/null || true
