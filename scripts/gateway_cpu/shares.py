"""Sum a py-spy raw profile of the gateway (run.sh with PYSPY=FILE) by layer. Usage: shares.py FILE

Each sample goes to the innermost frame that belongs to a known layer: the share of the gateway's
CPU each layer costs, itself and through what it calls outside the listed layers (C code, syscalls)."""

import collections
import sys

LAYERS = [
    ("uvicorn: HTTP parsing, socket writes to the client", ["uvicorn/"]),
    ("starlette: app, middleware stack, routing", ["starlette/"]),
    (
        "aiohttp: the upstream request, pool, parsing",
        ["aiohttp/", "multidict", "yarl/", "propcache", "aiohappyeyeballs"],
    ),
    ("httpx2: the worker client's API layer", ["httpx2/", "httpcore2/"]),
    ("backends/client.py, backends/transport.py", ["backends/"]),
    ("router/proxy.py, router/sse.py", ["router/proxy.py", "router/sse.py"]),
    (
        "edge, asgi, features, auth, middleware",
        [
            "router/edge.py",
            "router/asgi.py",
            "router/features.py",
            "router/auth.py",
            "router/middleware.py",
            "router/ratelimit.py",
        ],
    ),
    ("policy and fleet state", ["router/policies", "router/state", "router/types.py"]),
    (
        "metrics, request log, audit line (logging)",
        [
            "router/metrics.py",
            "prometheus_client",
            "router/requestlog.py",
            "router/audit.py",
            "orjson",
            "router/gateway.py",
            "logging/",
        ],
    ),
    ("json (stdlib)", ["json/"]),
    ("asyncio: the event loop (uvloop), tasks, timeouts", ["asyncio/", "uvloop", "contextlib", "_weakrefset"]),
]


def main(path: str) -> None:
    shares: collections.Counter[str] = collections.Counter()
    total = 0
    for line in open(path, encoding="utf-8"):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        layer = "other"
        for frame in reversed(stack.split(";")):
            found = next((name for name, marks in LAYERS if any(m in frame for m in marks)), None)
            if found:
                layer = found
                break
        shares[layer] += n
    for name, n in shares.most_common():
        print(f"{n / total * 100:5.1f} %  {name}")
    print(f"({total} samples)")


if __name__ == "__main__":
    main(sys.argv[1])
