"""Closed-loop load: N concurrent chat requests for D seconds. Usage: load.py URL D N [json|stream]

With ``stream`` the requests ask for ``stream: true`` and the whole SSE body is read."""

import asyncio
import sys
import time

import httpx2 as httpx


async def main(url: str, duration: float, concurrency: int, stream: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there " * 20}], "max_tokens": 16,
            "stream": stream}  # fmt: skip
    latencies: list[float] = []
    end = time.perf_counter() + duration
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:

        async def loop() -> None:
            while time.perf_counter() < end:
                t = time.perf_counter()
                r = await client.post(url + "/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*[loop() for _ in range(concurrency)])
    latencies.sort()
    print(f"{len(latencies) / duration:.0f} req/s p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:5] == ["stream"]))
