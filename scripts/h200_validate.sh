#!/usr/bin/env bash
# Real vLLM workers behind the gateway on the lent H200, driven by `chimera bench` (docs/REAL_VLLM.md).
# Run from the repo root after `bash .gpu/bin/setup.sh` (vLLM 0.26.0 in /tmp/site; see ../shared/gpu/README.md):
#   call 1, carry [.gpu/a, .gpu/bin]:        bash .gpu/bin/setup.sh && python3 .gpu/bin/mkmodels.py /tmp/models
#   call 2, carry [.gpu/b, .gpu/bin, .gpu/c]: bash .gpu/bin/setup.sh && bash scripts/h200_validate.sh
# 1. our package's deps: vLLM's carried deps bring starlette, uvicorn, pydantic, openai; the image has httpx,
#    pyyaml, prometheus-client, numpy, scikit-learn, matplotlib, rich; .gpu/c carries redis. No pip install -e
#    (no build backend offline): the repo root goes on PYTHONPATH and `chimera` is `python3 -m router.cli`.
# 2. `chimera workers up --config examples/h200-real.yaml` starts the three workers (and checks their KV).
# 3. one sim-fields proxy per worker (backends/simfields.py: exact output lengths and the sim's verdicts).
# 4. `chimera bench` per workload and policy, prefix caches reset between runs (VLLM_SERVER_DEV_MODE=1).
# 5. $OUT (<= 8 files): real-chat.json, real-mixed.json, workers-up.log, summary.txt, logs.tgz
# Knobs (environment): REAL (config), SEED, RATES_chat / RATES_mixed (space-separated lists), REPLICAS (gateway
# processes per run, sharing Redis: starts .gpu/c/redis-bin/redis-server when none answers), CLIENTS (load-client
# processes per run: `chimera bench --clients`), COLOCATE=1 (probe
# the workers sharing a GPU first: $OUT/colocate.json; COLOCATE_ARGS: more colocate.py probe options, e.g.
# "--alone --sampling greedy,bench", each worker's decode alone with the probes' and the bench's sampling), KEEP=1 (leave the workers running for the next call;
# a call that finds them all healthy skips the boot), CHAT_PROBE=1 (chat vs completions TTFT, direct and proxied, per worker), SPLIT_PROBE=1 (a busy worker's TTFT split by vLLM's own timings), BENCH_VOCAB=1 (a tokenizer with the bench's words: scripts/calibrate/bench_vocab.py).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_SERVER_DEV_MODE=1
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
T0=$(date +%s); BUDGET_S=${BUDGET_S:-520}; END=$((T0 + BUDGET_S))
L=${LOGS:-/tmp/vlog}; mkdir -p "$L"
exec > >(tee "$L/run.log") 2>&1
REAL=${REAL:-examples/h200-real.yaml}
POLICIES=${POLICIES:-"round_robin least_outstanding predictive"}
WORKLOADS=${WORKLOADS:-"chat mixed"}
RATES_chat=${RATES_chat:-6}; RATES_mixed=${RATES_mixed:-1}        # workflows/s (chat: requests/s)
SEED=${SEED:-1}; REPLICAS=${REPLICAS:-1}; CLIENTS=${CLIENTS:-1}
WARMUP=${WARMUP:-4}; DUR_chat=${DUR_chat:-16}; DUR_mixed=${DUR_mixed:-20}; DRAIN_chat=${DRAIN_chat:-15}
DRAIN_mixed=${DRAIN_mixed:-30}; BOOT_S=${BOOT_S:-300}
CHIMERA="python3 -m router.cli"
el() { echo "+$(( $(date +%s) - T0 )) s"; }
# merge_json OUT FILE...: the files' JSON documents as one list in OUT (a call brings back at most 8 files)
merge_json() { python3 -c "import json, sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], 'w'), indent=1)" "$@" 2>/dev/null; }
collect() {
  # this seed's runs only: on a warm machine (KEEP=1) the logs folder still holds earlier calls' seeds
  for wl in $WORKLOADS; do python3 scripts/real_vllm.py merge "$OUT/real-$wl.json" $L/bench-$wl-*-s$SEED 2>/dev/null; done
  cp "$L/workers-up.log" "$OUT/" 2>/dev/null
  { echo "elapsed $(el)"; nvidia-smi 2>&1 | head -25; cat "$L/versions.txt" 2>/dev/null; } > "$OUT/summary.txt"
  tar -C "$L" --exclude='*.whl' -czf "$OUT/logs.tgz" . 2>/dev/null
  ls -la "$OUT"; echo "done $(el)"
}

. scripts/h200_site.sh; h200_wheels
python3 -c "import router.cli, router.bench.runner, backends.simfields, backends.launcher, openai, starlette, uvicorn, \
pydantic, redis, sklearn, rich; print('starlette', starlette.__version__, 'pydantic', pydantic.VERSION, 'openai', \
openai.__version__)" > "$L/versions.txt" || { echo "BLOCKED: a dependency is missing (above)"; collect; exit 1; }
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >> "$L/versions.txt" 2>&1
cat "$L/versions.txt"
h200_models
# BENCH_VOCAB=1: every bench word its own token (without it the bench's English words are all <unk>: docs/REAL_VLLM.md
# "Rerun 3"); needs a fresh boot of the workers (a tokenizer is read at start-up)
[ "${BENCH_VOCAB:-0}" = 1 ] && python3 scripts/calibrate/bench_vocab.py /tmp/models
python3 scripts/real_vllm.py configs "$REAL" --real-out "$L/bench-real.yaml"

python3 scripts/real_vllm.py backends "$REAL" > "$L/backends.txt"
up_already() { while read -r name port rest; do curl -sf -m 2 "localhost:$port/health" > /dev/null || return 1; done < "$L/backends.txt"; }
if [ "$REPLICAS" -gt 1 ] && ! python3 -c "import redis; redis.Redis().ping()" 2>/dev/null; then
  LD_LIBRARY_PATH=$PWD/.gpu/c/redis-bin setsid .gpu/c/redis-bin/redis-server --port 6379 --save "" --appendonly no \
    > "$L/redis.log" 2>&1 &
  for _ in $(seq 50); do python3 -c "import redis; redis.Redis().ping()" 2>/dev/null && break; sleep 0.2; done
  python3 -c "import redis; print('redis', redis.Redis().info()['redis_version'])" || { echo "BLOCKED: no Redis"; collect; exit 1; }
fi
UP=""
if up_already; then echo "workers already healthy: no boot $(el)"; else
# 2. the workers, through the launcher itself
setsid $CHIMERA workers up --config "$REAL" --log-dir "$L/workers" --timeout "$BOOT_S" > "$L/workers-up.log" 2>&1 &
UP=$!
fallback() {  # the launcher failed: say so, then start the very commands it prints, so the bench still runs
  echo "workers up FAILED $(el):"; cat "$L/workers-up.log"; kill -TERM $UP 2>/dev/null; sleep 5
  grep -q "out of GPU memory\|not installed\|no GPU" "$L/workers-up.log" && { collect; exit 1; }
  UP=""; mkdir -p "$L/fallback"; i=0
  $CHIMERA workers up --config "$REAL" --dry-run | grep -v '^#' | while read -r cmd; do
    i=$((i + 1)); setsid bash -c "$cmd" > "$L/fallback/worker-$i.log" 2>&1 &
  done
  while read -r name port rest; do
    until curl -sf -m 2 "localhost:$port/health" > /dev/null; do
      [ "$(date +%s)" -gt $((T0 + BOOT_S + 60)) ] && { echo "fallback TIMEOUT $name"; collect; exit 1; }; sleep 2
    done
  done < <(python3 scripts/real_vllm.py backends "$REAL")
  echo "fallback workers healthy $(el)"
}
until grep -q "workers healthy" "$L/workers-up.log"; do
  if ! kill -0 $UP 2>/dev/null || [ "$(date +%s)" -gt $((T0 + BOOT_S + 30)) ]; then fallback; break; fi
  sleep 2
done
echo "workers healthy $(el)"; cat "$L/workers-up.log"
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv

if [ "${COLOCATE:-0}" = 1 ]; then
  args=$(while read -r name port model rest; do echo -n "$model=http://127.0.0.1:$port "; done < "$L/backends.txt")
  timeout 240 python3 scripts/calibrate/colocate.py probe --batches "${COLOCATE_BATCHES:-1,8,32}" --tokens 300 \
    ${COLOCATE_ARGS:-} --out "$OUT/colocate.json" $args | cut -c1-220
  echo "colocate done $(el)"
fi

# 3. the sim-fields proxies (port + 1000)
pkill -f backends.simfields 2>/dev/null; sleep 0.5
while read -r name port model profile seed; do
  setsid python3 -m backends.simfields --port $((port + 1000)) --upstream "http://127.0.0.1:$port" \
    --profile "$profile" --seed "$seed" > "$L/proxy-$name.log" 2>&1 &
done < "$L/backends.txt"
while read -r name port model profile seed; do
  for _ in $(seq 50); do curl -sf -m 2 "localhost:$((port + 1000))/health" > /dev/null && break; sleep 0.2; done
done < "$L/backends.txt"

# CHAT_PROBE=1: each worker's TTFT for chat vs plain completions, directly and through its proxy ($OUT/chat-<name>.json;
# scripts/calibrate/chat_probe.py): the profiles were fitted on completions, the bench sends chat
if [ "${CHAT_PROBE:-0}" = 1 ]; then
  while read -r name port model rest; do
    left=$(( END - $(date +%s) - 60 )); [ $left -lt 30 ] && { echo "SKIP chat probe $name: no time left $(el)"; continue; }
    timeout $(( left < 120 ? left : 120 )) python3 scripts/calibrate/chat_probe.py --model "$model" \
      --reps "${CHAT_REPS:-15}" --target direct=http://127.0.0.1:$port --target proxy=http://127.0.0.1:$((port + 1000)) \
      --out "$L/chat-$name.json"
  done < "$L/backends.txt"
  # one file in $OUT (a call brings back at most 8); each worker's is also in logs.tgz
  merge_json "$OUT/chat-probe.json" $L/chat-*.json
  echo "chat probe done $(el)"
fi

# SPLIT_PROBE=1: each worker's TTFT of one injected request while B streams decode, split by vLLM's own queue, prefill
# and TTFT histograms ($OUT/split-probe.json; scripts/calibrate/split_probe.py; SPLIT_ARGS: more options)
if [ "${SPLIT_PROBE:-0}" = 1 ]; then
  while read -r name port model rest; do
    left=$(( END - $(date +%s) - 30 )); [ $left -lt 30 ] && { echo "SKIP split probe $name: no time left $(el)"; continue; }
    timeout $(( left < 240 ? left : 240 )) python3 scripts/calibrate/split_probe.py --url http://127.0.0.1:$port \
      --model "$model" ${SPLIT_ARGS:-} --out "$L/split-$name.json"
  done < "$L/backends.txt"
  merge_json "$OUT/split-probe.json" $L/split-*.json
  echo "split probe done $(el)"
fi

# 4. the bench, one policy at a time, caches reset in between
for wl in $WORKLOADS; do
  dur=$(eval echo \$DUR_$wl); drain0=$(eval echo \$DRAIN_$wl)
  for rate in $(eval echo \$RATES_$wl); do
  for pol in $POLICIES; do
    drain=$drain0
    need=$((WARMUP + dur + drain + 12))
    if [ $(( END - $(date +%s) )) -lt $((WARMUP + dur + 15)) ]; then echo "SKIP $wl $pol: no time left $(el)"; continue; fi
    while read -r name port rest; do curl -s -m 5 -X POST "localhost:$port/reset_prefix_cache" > /dev/null; done < "$L/backends.txt"
    left=$(( END - $(date +%s) - 10 )); [ $need -gt $left ] && drain=$((left - WARMUP - dur - 12))
    echo "=== bench $wl $pol rate=$rate seed=$SEED replicas=$REPLICAS dur=$dur drain=$drain $(el)"
    timeout $((WARMUP + dur + drain + 40)) $CHIMERA bench --config "$L/bench-real.yaml" --workload "$wl" --policies "$pol" \
      --rate "$rate" --duration "$dur" --warmup "$WARMUP" --drain "$drain" --seed "$SEED" --replicas "$REPLICAS" --clients "$CLIENTS" \
      --no-plots --out "$L/bench-$wl-$pol-r$rate-s$SEED" 2>&1 | grep -v "^\s*$" | tail -4
  done
  done
done

# 5. stop the workers the way a user does (SIGTERM to `workers up`), then collect
if [ -n "$UP" ] && [ "${KEEP:-0}" != 1 ]; then
  kill -TERM $UP 2>/dev/null; for _ in $(seq 30); do kill -0 $UP 2>/dev/null || break; sleep 1; done
  if kill -0 $UP 2>/dev/null; then echo "workers up still running after SIGTERM $(el)"; else wait $UP; echo "workers up exit code $? $(el)"; fi
  tail -2 "$L/workers-up.log"
fi
collect
