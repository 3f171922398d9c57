"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` where no GPU and no vLLM exist.

It takes the launcher's flags, logs ``GPU KV cache size: N tokens`` like vLLM 0.26 and serves
``/health``, ``/metrics`` (``vllm:cache_config_info`` with ``num_gpu_blocks`` and ``block_size``)
and a streamed ``/v1/chat/completions`` that honours ``max_tokens``/``min_tokens`` (a random-weight
model never emits EOS), ``POST /reset_prefix_cache``. Behaviour per served model from
``FAKE_VLLM_MODES="model=mode,..."``: ``ok`` (default), ``oom`` (vLLM's OOM line, exit 1),
``exit`` (a last log line, exit 3), ``hang`` (never healthy). ``FAKE_VLLM_BYTES_PER_TOKEN`` sets
the KV bytes per token (default 12288, the Qwen2.5-0.5B shape); ``FAKE_VLLM_TOKEN_S`` the delay per token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = 16


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--kv-cache-memory-bytes", type=int, required=True)
    args, _ = p.parse_known_args()
    modes = dict(kv.split("=", 1) for kv in os.environ.get("FAKE_VLLM_MODES", "").split(",") if "=" in kv)
    mode = modes.get(args.served_model_name, "ok")
    print(f"INFO fake vLLM for {args.served_model_name} on GPU {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        return 1
    if mode == "exit":
        print("ValueError: the model's max seq len is larger than the KV cache", flush=True)
        return 3
    blocks = args.kv_cache_memory_bytes // int(os.environ.get("FAKE_VLLM_BYTES_PER_TOKEN", "12288")) // BLOCK
    print(f"INFO [kv_cache_utils.py:1] GPU KV cache size: {blocks * BLOCK:,} tokens", flush=True)
    token_s = float(os.environ.get("FAKE_VLLM_TOKEN_S", "0.001"))
    served, healthy = args.served_model_name, mode != "hang"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200 if healthy else 503, b"")
            elif self.path == "/metrics":
                info = (
                    f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",num_gpu_blocks="{blocks}",'
                    f'num_gpu_blocks_override="None"}} 1.0\nvllm:num_requests_running{{engine="0"}} 0.0\n'
                )
                self._send(200, info.encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": served, "object": "model"}]}).encode())
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            if self.path == "/reset_prefix_cache":
                self._send(200, b"")
                return
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"error": "not found"}')
                return
            n = int(body.get("max_tokens") or 16)
            prompt = sum(len(str(m.get("content", "")).split()) + 1 for m in body.get("messages", []))
            if not body.get("stream"):
                text = " ".join(f"w{i + 3}" for i in range(n))
                resp = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "model": served,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                    ],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
                }
                self._send(200, json.dumps(resp).encode())
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def event(obj: object) -> None:
                data = f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": served}
            event(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for i in range(n):
                time.sleep(token_s)
                last = i == n - 1
                event(
                    {
                        **head,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": f" w{i + 3}" if i else f"w{i + 3}"},
                                "logprobs": None,
                                "finish_reason": "length" if last else None,
                            }
                        ],
                    }
                )
            if (body.get("stream_options") or {}).get("include_usage"):
                event(
                    {
                        **head,
                        "choices": [],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
                    }
                )
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"INFO Starting vLLM API server on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
