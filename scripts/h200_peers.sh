#!/usr/bin/env bash
# chimera against vLLM Router on the real vLLM fleet of examples/h200-real.yaml (docs/benchmarks.md, "Head to
# head"): per seed, scripts/h200_validate.sh runs the mixed workload through vllm-router:cache_aware and through
# predictive at each cost (gateway.policy_options.wrong_answer_s; the predictor refitting on the run's own verdicts
# every 20 s), then chat through both; the fleet stays up between runs, prefix caches reset in between. Then
#   python scripts/real_vllm.py peers $OUT
# prints the table and writes $OUT/real-{mixed,chat}.json (predictive's rows as predictive_w<cost>).
# Needs vLLM and `chimera-router[bench,peers]` on the GPU machine (../shared/gpu/README.md for vLLM).
# Knobs (environment): SEEDS (1 2 3), COSTS (6 24), RATE (8 workflows/s), DUR (30 s measured), CRATE (12 chat
# requests/s), CDUR (20 s), CHAT_SEEDS (the seeds of the chat runs: SEEDS; empty: none), WARMUP (15 s: the
# predictor's first refit), OUT (/tmp/real-peers).
set -u
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"1 2 3"} COSTS=${COSTS:-"6 24"} RATE=${RATE:-8} DUR=${DUR:-30} CRATE=${CRATE:-12} CDUR=${CDUR:-20}
WARMUP=${WARMUP:-15} OUT=${OUT:-/tmp/real-peers} CHAT_SEEDS=${CHAT_SEEDS-$SEEDS}
mkdir -p "$OUT"
for w in $COSTS; do
  python - "$w" "$OUT/h200-real-w$w.yaml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open("examples/h200-real.yaml"))
cfg["gateway"]["policy_options"] = {"wrong_answer_s": float(sys.argv[1])}
cfg["gateway"]["predictor"] = {"refit_interval_s": 20, "min_samples": 200}
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
PY
done
first=$(echo $COSTS | cut -d' ' -f1)
export KEEP=1 CLIENTS=4
for s in $SEEDS; do
  for w in $COSTS; do
    pols=predictive; [ "$w" = "$first" ] && pols="vllm-router:cache_aware predictive"
    REAL=$OUT/h200-real-w$w.yaml OUT=$OUT/mixed-w$w-s$s SEED=$s WORKLOADS=mixed RATES_mixed=$RATE DUR_mixed=$DUR \
      DRAIN_mixed=25 WARMUP=$WARMUP POLICIES="$pols" bash scripts/h200_validate.sh 2>&1 | tail -4
  done
done
for s in $CHAT_SEEDS; do
  REAL=$OUT/h200-real-w$first.yaml OUT=$OUT/chat-s$s SEED=$s WORKLOADS=chat RATES_chat=$CRATE DUR_chat=$CDUR \
    DRAIN_chat=15 WARMUP=4 POLICIES="vllm-router:cache_aware predictive" bash scripts/h200_validate.sh 2>&1 | tail -4
done
pkill -f "router.cli workers"
