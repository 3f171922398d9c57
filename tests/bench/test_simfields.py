"""The sim-fields proxy in front of a vLLM-like worker (the stand-in of ``fake_vllm/``, a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.listen import free_port, wait_ready
from backends.sim.server import SimSettings, create_app
from backends.sim.textgen import chat_text, draw_answer
from chimera_bench.simfields import SimFieldsProxy, patch_event, rewrite
from router.wire import HeadFirstProtocol
from tests.conftest import ServerThread

FAKE = Path(__file__).resolve().parents[1] / "backends" / "fake_vllm"
MESSAGES = [{"role": "user", "content": "write a sorting function"}]


def test_rewrite_fixes_length_and_draws_the_sims_verdict() -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 512, "sim": {"output_tokens": 40, "difficulty": 0.3}}
    rw = rewrite(dict(body), quality=0.6, seed=2, chat=True)
    expected = draw_answer(2, "m", chat_text(MESSAGES), 0.6, 40, 0.3).marker
    assert rw.marker == expected and rw.marker in ("[correct]", "[wrong]")
    assert rw.body["max_tokens"] == rw.body["min_tokens"] == 39 and rw.body["ignore_eos"] is True
    assert "sim" not in rw.body
    capped = rewrite({**body, "max_tokens": 10}, quality=0.6, seed=2, chat=True)
    assert capped.marker is None and capped.body["max_tokens"] == 10  # truncated at the cap, as in the sim
    plain = rewrite({"model": "m", "messages": MESSAGES, "max_tokens": 7}, quality=0.6, seed=2, chat=True)
    assert plain.marker is None and plain.body == {"model": "m", "messages": MESSAGES, "max_tokens": 7}


def test_rewrite_reads_metadata_sim_where_a_peer_dropped_sim() -> None:
    sim = {"output_tokens": 40, "difficulty": 0.3}
    base = {"model": "m", "messages": MESSAGES, "max_tokens": 512}
    direct = rewrite({**base, "sim": sim}, quality=0.6, seed=2, chat=True)
    packed = rewrite({**base, "metadata": {"sim": json.dumps(sim), "app": "x"}}, quality=0.6, seed=2, chat=True)
    assert packed.marker == direct.marker and packed.body["max_tokens"] == 39
    assert packed.body["metadata"] == {"app": "x"}  # vLLM sees the user's metadata, not the bench's
    both = rewrite({**base, "sim": sim, "metadata": {"sim": json.dumps(sim)}}, quality=0.6, seed=2, chat=True)
    assert "metadata" not in both.body and both.marker == direct.marker
    broken = rewrite({**base, "metadata": {"sim": "{not json"}}, quality=0.6, seed=2, chat=True)
    assert broken.marker is None and broken.body == base


def test_patch_event_touches_only_the_finishing_chunk_and_usage() -> None:
    mid = b'{"choices":[{"index":0,"delta":{"content":" w5"},"finish_reason":null}]}'
    assert patch_event(mid, "[wrong]", chat=True) is mid
    last = json.loads(
        patch_event(b'{"choices":[{"delta":{"content":" w6"},"finish_reason":"length"}]}', "[wrong]", True)
    )
    assert last["choices"][0]["delta"]["content"] == " w6 [wrong]"
    usage = json.loads(patch_event(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,'
                                   b'"total_tokens":12}}', "[wrong]", True))  # fmt: skip
    assert usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}
    assert patch_event(b"[DONE]", "[wrong]", True) == b"[DONE]"


@pytest.fixture
def worker() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(FAKE), "FAKE_VLLM_TOKEN_S": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "x",
                             "--served-model-name", "m", "--port", str(port), "--host", "127.0.0.1",
                             "--kv-cache-memory-bytes", "1073741824"], env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", 10, proc=proc, poll_s=0.05)
    yield url
    proc.terminate()
    proc.wait(5)


def test_proxy_streams_exact_lengths_and_the_verdict(worker: str) -> None:
    with ServerThread(SimFieldsProxy(worker, quality=0.6, seed=2), http=HeadFirstProtocol) as proxy:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 512, "stream": True,
                "stream_options": {"include_usage": True}, "sim": {"output_tokens": 25, "difficulty": 0.3}}  # fmt: skip
        marker = draw_answer(2, "m", chat_text(MESSAGES), 0.6, 25, 0.3).marker
        text, usage = "", None
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
                    usage = chunk.get("usage") or usage
        assert text.split()[-1] == marker and len(text.split()) == 25
        assert usage is not None and usage["completion_tokens"] == 25
        full = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "stream": False, "stream_options": None})
        answer = full.json()
        assert answer["choices"][0]["message"]["content"].endswith(f" {marker}")
        assert answer["usage"]["completion_tokens"] == 25
        assert 'num_gpu_blocks="' in httpx.get(proxy.url + "/metrics").text  # passed through
        assert httpx.get(proxy.url + "/health").status_code == 200


def _running(url: str) -> float:
    line = next(x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


def test_a_client_that_leaves_aborts_the_workers_request() -> None:
    """The gateway cancelling an attempt closes its connection to the proxy: the proxy then closes its own
    to the worker, which aborts the request (vLLM does; here the sim, ~10 s of answer left)."""
    sim = ServerThread(create_app(SimSettings(profile="h200-qwen2.5-1.5b", speedup=0.1))).start()
    try:
        with ServerThread(SimFieldsProxy(sim.url, quality=0.6), http=HeadFirstProtocol) as proxy:
            body = {"model": "qwen2.5-1.5b", "messages": MESSAGES, "stream": True, "max_tokens": 600,
                    "sim": {"output_tokens": 500, "difficulty": 0.3}}  # fmt: skip
            with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()  # held: dropping the iterator would close the stream here
                while not (line := next(lines)).startswith('data: {"') or '"content":"tok' not in line:
                    pass  # until the first token (the role chunk, content "", comes before it)
                assert _running(sim.url) == 1  # decoding; now leave
            deadline = time.monotonic() + 3
            while _running(sim.url) != 0:
                assert time.monotonic() < deadline, "the worker kept generating for a client that left"
                time.sleep(0.05)
    finally:
        sim.stop()


def test_a_dead_worker_is_a_502_with_an_error_body() -> None:
    with ServerThread(SimFieldsProxy(f"http://127.0.0.1:{free_port()}", quality=0.6), http=HeadFirstProtocol) as proxy:
        resp = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert resp.status_code == 502 and resp.json()["error"]["message"].startswith("upstream:")
