#!/usr/bin/env python3
"""Shrink raw device results in place so they can be committed (idempotent).

Keeps every client-side number; of the scraped vllm:* deltas keeps only the ones the fit and the report use;
of each vLLM log keeps the lines worth reading (KV size, args, load/compile/graph times, errors).

    python scripts/calibrate/compact.py scripts/calibrate/data/*.json
"""

import json
import re
import sys

KEEP = re.compile(
    r"vllm:(iteration_tokens_total_(count|sum)|num_preemptions_total|prompt_tokens_total|"
    r"generation_tokens_total|(time_to_first_token|inter_token_latency|request_prefill_time|"
    r"request_decode_time|request_queue_time|e2e_request_latency)_seconds_(sum|count)|"
    r"prefix_cache_(hits|queries)_total)$"
)
LINE = re.compile(
    r"GPU KV cache size|Maximum concurrency|non-default args|Model loading took|torch.compile took|"
    r"Graph capturing finished|init engine|Asynchronous scheduling|Chunked prefill|ERROR|Traceback"
)


def walk(x):
    if isinstance(x, dict):
        return {
            k: (
                ({kk: vv for kk, vv in v.items() if KEEP.match(kk)})
                if k == "metrics_delta" and isinstance(v, dict)
                else walk(v)
            )
            for k, v in x.items()
        }
    if isinstance(x, list):
        return [walk(v) for v in x]
    if isinstance(x, float):
        return round(x, 4) if x == x else None  # NaN (a rejected request) -> null: strict JSON
    return x


for path in sys.argv[1:]:
    d = json.load(open(path))
    d = walk(d)
    if "workers" in d:  # a run summary
        for w in d["workers"].values():
            w["lines"] = [ln[-400:] for ln in w["lines"] if LINE.search(ln) and "it/s]" not in ln]
    with open(path, "w") as f:
        json.dump(d, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(path, len(json.dumps(d)) // 1024, "KB")
