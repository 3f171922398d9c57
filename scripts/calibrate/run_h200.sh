#!/usr/bin/env bash
# Calibration run on the lent H200 (see docs/CALIBRATION.md). Run from the repo root, after
#   bash .gpu/bin/setup.sh            (vLLM 0.26.0 into /tmp/site; models from .gpu/bin/mkmodels.py in /tmp/models)
# Starts the four Qwen2.5-shaped workers with the team's launch flags (16 GiB KV each) plus a small-KV 0.5B worker
# for the KV-pressure probe, all at once on the one GPU, then probes ONE worker at a time with
# scripts/calibrate/probe.py. Everything that must come back lands in $OUT (<= 8 files):
#   probe-<model>.json x4, probe-kvsmall.json, summary.json (KV lines, nvidia-smi, versions, flags), logs.tgz
set -u
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/calib-out}; mkdir -p "$OUT"
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-520}            # the whole script must end inside the call's 600 s (setup.sh ran before)
END=$((T0 + BUDGET_S))
L=/tmp/vlog; mkdir -p $L
exec > >(tee $L/run.log) 2>&1
[ -d /tmp/models/qwen2.5-14b ] || python3 .gpu/bin/mkmodels.py /tmp/models > /dev/null

KV_GIB=${KV_GIB:-16}
SMALL_KV_BYTES=${SMALL_KV_BYTES:-402653184}     # 0.375 GiB = 2048 blocks x 16 tokens for the 0.5B shape
COMMON="--load-format dummy --dtype bfloat16 --max-model-len 16384 --max-cudagraph-capture-size 128"
FLAGS="$COMMON --kv-cache-memory-bytes $((KV_GIB*1024*1024*1024)) --gpu-memory-utilization 0.3"
SMALL_FLAGS="$COMMON --kv-cache-memory-bytes $SMALL_KV_BYTES --gpu-memory-utilization 0.1"
# name:model:port  (the small-KV worker gets its own compile cache so two processes never write one)
WORKERS=${WORKERS:-"qwen2.5-14b:qwen2.5-14b:8004 qwen2.5-7b:qwen2.5-7b:8003 qwen2.5-1.5b:qwen2.5-1.5b:8002 qwen2.5-0.5b:qwen2.5-0.5b:8001 kvsmall:qwen2.5-0.5b:8005"}

launch() {  # name model port
  local f="$FLAGS"; [ "$1" = kvsmall ] && f="$SMALL_FLAGS"
  VLLM_CACHE_ROOT=/tmp/vcache-$1 setsid python3 -m vllm.entrypoints.openai.api_server --model /tmp/models/$2 \
    --served-model-name $2 --port $3 $f > $L/vllm-$1.log 2>&1 &
  echo $! > $L/pid-$1
  echo "launched $1 ($2) on :$3 pid $(cat $L/pid-$1) at +$(( $(date +%s) - T0 )) s: $f"
}
alive() { kill -0 "$(cat $L/pid-$1)" 2>/dev/null; }
healthy() { curl -sf -m 2 localhost:$1/health > /dev/null; }
wait_up() {  # names... ; returns once all are healthy or dead or BOOT_S passed
  local t=$(date +%s)
  for w in $WORKERS; do IFS=: read n m p <<< "$w"; echo "$*" | grep -qw "$n" || continue
    while ! healthy $p; do
      if ! alive $n; then echo "DEAD $n"; tail -25 $L/vllm-$n.log; break; fi
      if [ $(( $(date +%s) - t )) -gt ${BOOT_S:-330} ]; then echo "BOOT TIMEOUT $n"; tail -25 $L/vllm-$n.log; break; fi
      sleep 2
    done
    healthy $p && echo "up $n after $(( $(date +%s) - T0 )) s"
  done
}
stop() { kill -- -"$(cat $L/pid-$1)" 2>/dev/null; }

names=""; for w in $WORKERS; do IFS=: read n m p <<< "$w"; launch $n $m $p; names="$names $n"; done
wait_up $names
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>/dev/null | tee $L/versions.txt
nvidia-smi > $L/nvidia-smi.txt 2>&1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> $L/nvidia-smi.txt 2>&1
ps -eo pid,args | grep -E "api_server|EngineCore" | grep -v grep | cut -c1-200 >> $L/nvidia-smi.txt
cat $L/nvidia-smi.txt | head -30

probe() {  # name model port cap_s extra-args...
  local n=$1 m=$2 p=$3 cap=$4; shift 4
  healthy $p || { echo "skip $n (not healthy)"; return; }
  local now=$(date +%s) dl=$(( $(date +%s) + cap )); [ $dl -gt $((END - 15)) ] && dl=$((END - 15))
  [ $dl -le $((now + 10)) ] && { echo "skip $n (no time left)"; return; }
  echo "=== probe $n at +$((now - T0)) s, deadline +$((dl - T0)) s"
  timeout $(( dl - now + 40 )) python3 scripts/calibrate/probe.py --url http://127.0.0.1:$p --model $m \
    --out $OUT/${TAG:-probe}-$n.json --procs 8 --deadline $dl "$@" $PROBE_ARGS
  echo "=== done $n rc=$? at +$(( $(date +%s) - T0 )) s"
}
# Run 1 (default): KV pressure first (the fidelity check needs it), then the four profiles, small to large.
# Run 2 (RUN=2, WORKERS without kvsmall): the sweeps across the CUDA-graph limit, and two more mixed steps.
PROBE_ARGS=${PROBE_ARGS:-}
if [ "${RUN:-1}" = 2 ]; then
  TAG=${TAG:-probe2}
  for w in $WORKERS; do IFS=: read n m p <<< "$w"; cap=75; [ $n = qwen2.5-14b ] && cap=110
    case $n in *0.5b) mo=880;; *1.5b) mo=640;; *7b) mo=640;; *) mo=340;; esac   # ~3 s of decode (run 1)
    probe $n $m $p $cap --phases psweep,dsweep,mix --quick --mix-inject 512,4096 --mix-at 0.8,1.6 --mix-out $mo; done
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,pstate --format=csv >> $L/nvidia-smi.txt 2>&1
else
probe kvsmall qwen2.5-0.5b 8005 60 --phases kv --quick
probe qwen2.5-0.5b qwen2.5-0.5b 8001 75
probe qwen2.5-1.5b qwen2.5-1.5b 8002 75
probe qwen2.5-7b qwen2.5-7b 8003 95
probe qwen2.5-14b qwen2.5-14b 8004 120
fi

# second wave for any main worker that did not come up with the others (e.g. memory), if time is left
failed=""; for w in $WORKERS; do IFS=: read n m p <<< "$w"; [ $n = kvsmall ] && continue; [ -f $OUT/${TAG:-probe}-$n.json ] || failed="$failed $w"; done
if [ -n "$failed" ] && [ $(( END - $(date +%s) )) -gt 200 ]; then
  echo "second wave:$failed"
  for w in $WORKERS; do IFS=: read n m p <<< "$w"; stop $n; done; sleep 8
  WORKERS="$failed"; names=""
  for w in $failed; do IFS=: read n m p <<< "$w"; launch $n $m $p; names="$names $n"; done
  BOOT_S=150 wait_up $names
  for w in $failed; do IFS=: read n m p <<< "$w"; probe $n $m $p 100; done
fi

# summary: KV sizes, graph capture, memory, versions, flags
python3 - "$L" "$OUT/summary.json" "$FLAGS" "$SMALL_FLAGS" <<'EOF'
import glob, json, os, re, sys
L, out, flags, small = sys.argv[1:5]
s = {"flags": flags, "small_kv_flags": small, "workers": {}, "versions": open(f"{L}/versions.txt").read().strip()
     if os.path.exists(f"{L}/versions.txt") else None, "nvidia_smi": open(f"{L}/nvidia-smi.txt").read()}
pat = re.compile(r"GPU KV cache size|Maximum concurrency|KV cache|CUDA graph|cudagraph|Graph capturing|init engine|"
                 r"torch.compile|Loading weights took|Model loading took|memory|Available routes|ERROR|Error", re.I)
for f in sorted(glob.glob(f"{L}/vllm-*.log")):
    n = os.path.basename(f)[5:-4]
    lines = open(f, errors="replace").read().splitlines()
    kv = [l for l in lines if "GPU KV cache size" in l]
    m = re.search(r"GPU KV cache size: ([\d,]+) tokens", kv[-1]) if kv else None
    s["workers"][n] = {"kv_tokens": int(m.group(1).replace(",", "")) if m else None,
                       "lines": [l[-300:] for l in lines if pat.search(l)][:80]}
json.dump(s, open(out, "w"), indent=1)
print({n: w["kv_tokens"] for n, w in s["workers"].items()})
EOF
tar -C $L -czf $OUT/logs.tgz . 2>/dev/null
ls -la $OUT; echo "total +$(( $(date +%s) - T0 )) s"
