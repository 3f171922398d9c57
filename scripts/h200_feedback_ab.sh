#!/usr/bin/env bash
# Same-boot A/B of the predictive policy with and without latency feedback on the real H200 fleet
# (docs/REAL_VLLM.md, "Rerun 8"). Runs the committed tree from a `git archive`, so uncommitted work in
# the checkout the device copies does not leak in:
#   here:      git archive HEAD -o .gpu/head.tar; mkdir -p .gpu/cmd; cp scripts/h200_feedback_ab.sh .gpu/cmd/
#   call 1, carry [.gpu/a, .gpu/bin]:                             bash .gpu/bin/setup.sh && python3 .gpu/bin/mkmodels.py /tmp/models
#   call 2, carry [.gpu/b, .gpu/bin, .gpu/c, .gpu/head.tar, .gpu/cmd]: bash .gpu/cmd/h200_feedback_ab.sh
# For each seed (SEEDS, default "3 1"): round_robin and predictive on examples/h200-real.yaml, then predictive
# on a copy with `policy_options: {latency_feedback: false}`; the workers boot once (KEEP=1) and serve all runs.
# $OUT/s<seed>/real-mixed.json and $OUT/s<seed>-nofb/real-mixed.json. A slow boot (150 s) can leave too little
# of the first seed's budget for its last run: the script then says SKIP, and a later call on the warm machine
# (workers still up) can run what was skipped.
set -u
bash .gpu/bin/setup.sh > /dev/null 2>&1
mkdir -p /tmp/head && tar -xf .gpu/head.tar -C /tmp/head && ln -sfn "$PWD/.gpu" /tmp/head/.gpu && cd /tmp/head
sed '/^  policy: predictive/a\  policy_options: {latency_feedback: false}' examples/h200-real.yaml > examples/h200-real-nofb.yaml
O=${OUT:-/tmp/h200-out}; first=1
for s in ${SEEDS:-3 1}; do
  budget=$([ $first = 1 ] && echo 280 || echo 140); first=0
  OUT=$O/s$s LOGS=/tmp/vlog-s$s SEED=$s BENCH_VOCAB=1 WORKLOADS=mixed POLICIES="round_robin predictive" KEEP=1 \
    BUDGET_S=$budget DRAIN_mixed=25 bash scripts/h200_validate.sh 2>&1 | grep -E "^│|===|done|healthy|SKIP" | cut -c1-300
  OUT=$O/s$s-nofb LOGS=/tmp/vlog-s$s-nofb REAL=examples/h200-real-nofb.yaml SEED=$s BENCH_VOCAB=1 WORKLOADS=mixed \
    POLICIES=predictive KEEP=1 BUDGET_S=90 DRAIN_mixed=25 bash scripts/h200_validate.sh 2>&1 | grep -E "^│|===|done|healthy|SKIP" | cut -c1-300
done
