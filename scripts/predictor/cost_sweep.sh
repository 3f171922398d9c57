#!/usr/bin/env bash
# The measured latency / task-success frontier of the predictive policy (docs/PREDICTOR.md, "The cost
# knob, measured"): round robin and least outstanding, then predictive at each `wrong_answer_s` in
# COSTS (0 = Chimera's slack rule), all in one sitting over the same seeded workload (`mixed` by default), then
# one results.json with the predictive rows renamed `predictive_w<cost>`.
#
#   MODEL=logs/hetero.pkl OUT=logs/cost-sweep bash scripts/predictor/cost_sweep.sh
#   python scripts/predictor/policy_table.py logs/cost-sweep/results.json
#
# CONFIG (default examples/bench-hetero-learned.yaml: any config with sim workers and agents), MODEL (a trained
# predictor for gateway.predictor.model; empty: the config's own, or the analytic prior), WORKLOAD (mixed),
# COSTS (default "0 3 6 12 24", spaces or commas), RATES ("2,4"), SEEDS ("1,2,3"), DURATION (15), SPEEDUP (0.25)
# may be overridden. Run from the repository root with the venv active; the example's model is trained as
# docs/BENCHMARKS.md says.
set -euo pipefail
CONFIG=${CONFIG:-examples/bench-hetero-learned.yaml} MODEL=${MODEL-logs/hetero.pkl} OUT=${OUT:-logs/cost-sweep}
WORKLOAD=${WORKLOAD:-mixed} SPEEDUP=${SPEEDUP:-0.25}
COSTS=$(tr ',' ' ' <<< "${COSTS:-0 3 6 12 24}") RATES=${RATES:-2,4} SEEDS=${SEEDS:-1,2,3} DURATION=${DURATION:-15}
if [ -n "$MODEL" ] && [ ! -f "$MODEL" ]; then
  echo "cost_sweep: no model at $MODEL (MODEL= to use the config's; docs/BENCHMARKS.md trains the example's)" >&2; exit 2
fi
mkdir -p "$OUT"
bench() {  # config, policies, out
  chimera bench --config "$1" --workload "$WORKLOAD" --policies "$2" --rate "$RATES" --seeds "$SEEDS" --speedup "$SPEEDUP" \
    --duration "$DURATION" --warmup 3 --drain 40 --no-plots --out "$3"
}
cfg() {  # the config with this model and cost
  python - "$CONFIG" "$MODEL" "$1" "$OUT/cfg-w$1.yaml" <<'EOF'
import sys, yaml
config, model, cost, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
d = yaml.safe_load(open(config, encoding="utf-8"))
if model:
    d["gateway"]["predictor"] = {**(d["gateway"].get("predictor") or {}), "model": model}
d["gateway"]["policy_options"] = {**(d["gateway"].get("policy_options") or {}), "wrong_answer_s": cost}
yaml.safe_dump(d, open(out, "w", encoding="utf-8"), sort_keys=False)
EOF
}
cfg 6
bench "$OUT/cfg-w6.yaml" round_robin,least_outstanding "$OUT/baselines"
for c in $COSTS; do
  cfg "$c"
  bench "$OUT/cfg-w$c.yaml" predictive "$OUT/w$c"
done
python - "$OUT" $COSTS <<'EOF'
import json, sys
from pathlib import Path
out, costs = Path(sys.argv[1]), sys.argv[2:]
rows = json.loads((out / "baselines" / "results.json").read_text())
for c in costs:
    for r in json.loads((out / f"w{c}" / "results.json").read_text()):
        rows.append({**r, "policy": f"predictive_w{c}"})
(out / "results.json").write_text(json.dumps(rows, indent=1))
print(f"{out}/results.json: {len(rows)} runs")
EOF
