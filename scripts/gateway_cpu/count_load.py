"""Closed-loop load of a fixed number of requests: count_load.py URL N CONCURRENCY json|stream"""

import asyncio
import sys

import httpx2 as httpx


async def main(url: str, n: int, concurrency: int, stream: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there " * 20}], "max_tokens": 16,
            "stream": stream}  # fmt: skip
    left = [n]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def loop() -> None:
            while left[0] > 0:
                left[0] -= 1
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text

        await asyncio.gather(*[loop() for _ in range(concurrency)])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "stream"))
