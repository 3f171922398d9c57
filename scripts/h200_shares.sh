#!/usr/bin/env bash
# Each agent's share of steps per worker under `predictive`, with and without spread_margin, over several boots
# of the real vLLM fleet (examples/h200-real.yaml): per boot, scripts/h200_validate.sh runs the mixed workload once
# per variant (the order alternating from boot to boot), then the workers are stopped; the gateway's request logs
# land in $OUT as boot<N>-<variant>.jsonl. Then:
#   python scripts/real_vllm.py shares $OUT/boot*-spread.jsonl; python scripts/real_vllm.py shares $OUT/boot*-nospread.jsonl
# Knobs (environment): BOOTS (3), OUT (/tmp/real-shares), DUR (30 s of measured load per run), DRAIN (25).
set -u
cd "$(dirname "$0")/.."
BOOTS=${BOOTS:-3} OUT=${OUT:-/tmp/real-shares} DUR=${DUR:-30} DRAIN=${DRAIN:-25}
mkdir -p "$OUT"
sed 's/^  policy: predictive$/  policy: predictive\n  policy_options: {spread_margin: 0}/' examples/h200-real.yaml \
  > "$OUT/h200-real-nospread.yaml"
for b in $(seq "$BOOTS"); do
  order="spread nospread"; [ $((b % 2)) = 0 ] && order="nospread spread"
  for v in $order; do
    cfg=examples/h200-real.yaml; [ "$v" = nospread ] && cfg=$OUT/h200-real-nospread.yaml
    REAL=$cfg OUT=$OUT/run-$b-$v POLICIES=predictive WORKLOADS=mixed RATES_mixed=1 DUR_mixed=$DUR DRAIN_mixed=$DRAIN \
      WARMUP=4 KEEP=1 bash scripts/h200_validate.sh 2>&1 | tail -4
    cp "$OUT"/run-$b-$v/logs/bench-mixed-predictive-r1-s1/logs/requests-*.jsonl "$OUT/boot$b-$v.jsonl"
    cp "$OUT/run-$b-$v/real-mixed.json" "$OUT/boot$b-$v-results.json"
  done
  pkill -f "router.cli workers"; pkill -f vllm.entrypoints; sleep 8  # the next boot starts the fleet afresh
done
