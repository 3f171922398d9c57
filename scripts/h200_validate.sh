#!/usr/bin/env bash
# The bench on real vLLM workers: the config's `launch:` workers started by `chimera workers up` (or found healthy),
# a sim-fields proxy in front of each (`python -m chimera_bench.simfields`: the bench's exact output lengths and the
# simulator's verdicts on real vLLM), then `chimera bench` per workload, rate and policy, every prefix cache reset in
# between; the results of each workload merged into $OUT/real-<workload>.json. Run from anywhere, on the GPU machine,
# with vLLM and `chimera-router[bench]` installed and the config's models where its `launch.hf_model` says:
#   REAL=examples/h200-real.yaml OUT=/tmp/real-vllm bash scripts/h200_validate.sh
# The simulator on the same fleet, and the table of one against the other:
#   python scripts/real_vllm.py configs examples/h200-real.yaml --real-out /dev/null --sim-out sim.yaml
#   chimera bench --config sim.yaml --workload mixed --policies round_robin,least_outstanding,predictive \
#     --rate 1 --seed 1 --warmup 4 --duration 20 --drain 30 --no-plots --out sim-mixed
#   python scripts/real_vllm.py table --real /tmp/real-vllm/real-mixed.json --sim sim-mixed/results.json
# Knobs (environment): REAL (config), OUT, POLICIES, WORKLOADS, RATES_<workload> (space-separated), SEED, WARMUP,
# DUR_<workload>, DRAIN_<workload>, REPLICAS (gateway processes per run: the config's state must be redis://),
# CLIENTS (load-client processes per run), BOOT_S (seconds the workers may take to come up), KEEP=1 (leave them up).
set -u
cd "$(dirname "$0")/.."
export VLLM_SERVER_DEV_MODE=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1  # dev mode: POST /reset_prefix_cache
REAL=${REAL:-examples/h200-real.yaml} OUT=${OUT:-/tmp/real-vllm}
POLICIES=${POLICIES:-"round_robin least_outstanding predictive"} WORKLOADS=${WORKLOADS:-"chat mixed"}
RATES_chat=${RATES_chat:-6} RATES_mixed=${RATES_mixed:-1} SEED=${SEED:-1} REPLICAS=${REPLICAS:-1} CLIENTS=${CLIENTS:-1}
WARMUP=${WARMUP:-4} DUR_chat=${DUR_chat:-16} DUR_mixed=${DUR_mixed:-20} DRAIN_chat=${DRAIN_chat:-15}
DRAIN_mixed=${DRAIN_mixed:-30} BOOT_S=${BOOT_S:-900}
L=$OUT/logs; mkdir -p "$L"
python -m router.cli check "$REAL" > /dev/null || exit 2
python scripts/real_vllm.py configs "$REAL" --real-out "$L/bench-real.yaml"
python scripts/real_vllm.py backends "$REAL" > "$L/backends.txt"
healthy() { while read -r _ port _; do curl -sf -m 2 "localhost:$port/health" > /dev/null || return 1; done < "$1"; }

UP="" PROXIES=""
stop() {
  for p in $PROXIES; do kill "$p" 2> /dev/null; done
  if [ -n "$UP" ] && [ "${KEEP:-0}" != 1 ]; then kill -TERM "$UP" 2> /dev/null; wait "$UP"; fi
}
trap stop EXIT
if healthy "$L/backends.txt"; then echo "workers already healthy: no boot"; else
  python -m router.cli workers up --config "$REAL" --log-dir "$L/workers" --timeout "$BOOT_S" > "$L/workers-up.log" 2>&1 &
  UP=$!
  until grep -q "workers healthy" "$L/workers-up.log"; do
    kill -0 "$UP" 2> /dev/null || { echo "chimera workers up failed:"; cat "$L/workers-up.log"; UP=""; exit 1; }
    sleep 2
  done
  cat "$L/workers-up.log"
fi

while read -r name port _; do echo "$name $((port + 1000))"; done < "$L/backends.txt" > "$L/proxies.txt"
while read -r name port model profile seed; do
  python -m chimera_bench.simfields --port $((port + 1000)) --upstream "http://127.0.0.1:$port" --profile "$profile" \
    --seed "$seed" > "$L/proxy-$name.log" 2>&1 &
  PROXIES="$PROXIES $!"
done < "$L/backends.txt"
for _ in $(seq 100); do healthy "$L/proxies.txt" && break; sleep 0.2; done
healthy "$L/proxies.txt" || { echo "a sim-fields proxy did not start: $L/proxy-*.log"; exit 1; }

for wl in $WORKLOADS; do
  dur=$(eval echo "\$DUR_$wl") drain=$(eval echo "\$DRAIN_$wl")
  for rate in $(eval echo "\$RATES_$wl"); do
    for pol in $POLICIES; do
      while read -r _ port _; do curl -s -m 5 -X POST "localhost:$port/reset_prefix_cache" > /dev/null; done < "$L/backends.txt"
      echo "=== bench $wl $pol rate=$rate seed=$SEED"
      python -m router.cli bench --config "$L/bench-real.yaml" --workload "$wl" --policies "$pol" --rate "$rate" \
        --duration "$dur" --warmup "$WARMUP" --drain "$drain" --seed "$SEED" --replicas "$REPLICAS" --clients "$CLIENTS" \
        --no-plots --out "$L/bench-$wl-$pol-r$rate-s$SEED" 2>&1 | tail -4
    done
  done
  python scripts/real_vllm.py merge "$OUT/real-$wl.json" "$L"/bench-"$wl"-*-s"$SEED"
done
