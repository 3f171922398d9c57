"""The simulated worker over the wire: a real uvicorn on loopback, the official openai SDK as client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerThread

SimServer = Callable[..., ServerThread]
Profile = Callable[..., str]


@contextmanager
def sdk(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        yield client


def metrics(srv: ServerThread) -> dict[str, float]:
    """Samples by name (labels dropped; histogram buckets skipped)."""
    text = httpx.get(f"{srv.url}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_bucket"):
                out[s.name] = s.value
    return out


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def stream_timing(client: openai.OpenAI, prompt: str, out: int, **extra: Any) -> tuple[float, float, int]:
    """(TTFT, e2e, token chunks) of one streamed completion as the client sees them."""
    t0 = time.perf_counter()
    ttft, chunks = -1.0, 0
    stream = client.completions.create(
        model="sim-test",
        prompt=prompt,
        max_tokens=out,
        stream=True,
        extra_body={"sim": {"output_tokens": out}, **extra},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            chunks += 1
            if ttft < 0:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0, chunks


# -- API surface ----------------------------------------------------------------------------------
def test_models_health_and_metric_names(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(), model="served-name")
    with sdk(srv) as client:
        assert [m.id for m in client.models.list().data] == ["served-name"]
    health = httpx.get(f"{srv.url}/health")
    assert health.status_code == 200 and health.content == b""
    text = httpx.get(f"{srv.url}/metrics").text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "sim:engine_lag_seconds",
    ):  # fmt: skip
        assert f"\n{name}{{" in text, name
    assert 'model_name="served-name"' in text
    assert 'vllm:cache_config_info{block_size="16"' in text and "num_gpu_blocks=" in text


def test_completion_usage_and_length_controls(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(), speedup=20.0)
    with sdk(srv) as client:

        def complete(**kw: Any) -> Any:
            sim = kw.pop("sim")
            return client.completions.create(model="sim-test", prompt="one two three", extra_body={"sim": sim}, **kw)

        r = complete(sim={"output_tokens": 12}, max_tokens=100)
        assert r.choices[0].finish_reason == "stop" and len(r.choices[0].text.split()) == 12
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 12, 15)
        assert r.id.startswith("cmpl-") and r.model == "sim-test" and r.created > 0

        cut = complete(sim={"output_tokens": 50, "difficulty": 0.1}, max_tokens=10)
        assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 10
        assert not cut.choices[0].text.endswith(("[correct]", "[wrong]"))  # a cut answer has no verdict

        ignore = client.completions.create(
            model="sim-test", prompt="one two three", max_tokens=20,
            extra_body={"sim": {"output_tokens": 5}, "ignore_eos": True},
        )  # fmt: skip
        assert ignore.usage.completion_tokens == 20 and ignore.choices[0].finish_reason == "length"
        least = client.completions.create(
            model="sim-test", prompt="one two three", max_tokens=20,
            extra_body={"sim": {"output_tokens": 3}, "min_tokens": 8},
        )  # fmt: skip
        assert least.usage.completion_tokens == 8 and least.choices[0].finish_reason == "stop"

        graded = complete(sim={"output_tokens": 6, "difficulty": 0.5}, max_tokens=50)
        assert graded.choices[0].text.split()[-1] in ("[correct]", "[wrong]")
        assert graded.usage.completion_tokens == 6
        plain = client.completions.create(model="sim-test", prompt="no sim field at all", max_tokens=40)
        assert plain.usage.completion_tokens == len(plain.choices[0].text.split()) <= 40
        assert not plain.choices[0].text.endswith("]")


def test_chat_stream_chunk_per_token_with_usage(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(), speedup=20.0)
    with sdk(srv) as client:
        stream = client.chat.completions.create(
            model="sim-test", messages=[{"role": "user", "content": "hello there"}], stream=True,
            stream_options={"include_usage": True},
            extra_body={"sim": {"output_tokens": 17, "difficulty": 0.3}, "unknown_field": {"x": 1}},
        )  # fmt: skip
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 17
    assert content[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 17 and chunks[-1].usage.prompt_tokens == 3  # "user hello there"
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert len(text.split()) == 17 and text.split()[-1] in ("[correct]", "[wrong]")
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")


async def test_async_client_streams_concurrently(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(), speedup=20.0)
    async with openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0) as client:

        async def one(k: int) -> tuple[int, int]:
            stream = await client.completions.create(
                model="sim-test", prompt=f"async {k}", max_tokens=64, stream=True,
                stream_options={"include_usage": True}, extra_body={"sim": {"output_tokens": 10 + k}},
            )  # fmt: skip
            n, usage = 0, -1
            async for chunk in stream:
                n += sum(1 for c in chunk.choices if c.text)
                if chunk.usage:
                    usage = chunk.usage.completion_tokens
            return n, usage

        results = await asyncio.gather(*(one(k) for k in range(20)))
    assert results == [(10 + k, 10 + k) for k in range(20)]


def test_outputs_are_reproducible_under_a_seed(sim_server: SimServer, sim_profile: Profile) -> None:
    path = sim_profile()
    servers = [sim_server(profile=path, speedup=20.0, seed=s) for s in (3, 3, 4)]

    def answer(srv: ServerThread, prompt: str) -> tuple[str, int]:
        with sdk(srv) as client:
            r = client.chat.completions.create(
                model="sim-test", messages=[{"role": "user", "content": prompt}], max_tokens=400,
                extra_body={"sim": {"difficulty": 0.6}},
            )  # fmt: skip
        return r.choices[0].message.content or "", r.usage.completion_tokens if r.usage else -1

    prompts = [f"question number {i}" for i in range(4)]
    a = [answer(servers[0], p) for p in prompts]
    b = [answer(servers[1], p) for p in reversed(prompts)][::-1]  # arrival order does not matter
    c = [answer(servers[2], p) for p in prompts]
    assert a == b
    assert a != c
    assert all(len(text.split()) == n for text, n in a)


def test_error_envelopes(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(max_model_len=100))
    with sdk(srv) as client:
        with pytest.raises(openai.NotFoundError) as nf:
            client.completions.create(model="nope", prompt="x")
        assert nf.value.status_code == 404
        with pytest.raises(openai.BadRequestError) as long_prompt:
            client.completions.create(model="sim-test", prompt=words(90), max_tokens=20)
        assert "maximum context length is 100" in str(long_prompt.value)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="sim-test", prompt="x", n=0)
    bad = httpx.post(f"{srv.url}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    missing = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "sim-test"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"


def test_the_hidden_fields_also_ride_in_metadata(sim_server: SimServer, sim_profile: Profile) -> None:
    """A router that re-encodes requests (SGLang's keeps `metadata`, drops `sim`) still carries the hidden fields."""
    import json

    srv = sim_server(profile=sim_profile())
    with sdk(srv) as client:
        meta = {"sim": json.dumps({"output_tokens": 7, "difficulty": 0.01})}
        r = client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=50, metadata=meta)  # fmt: skip
        assert r.usage.completion_tokens == 7  # the length came from metadata.sim (max_tokens is 50)
        with pytest.raises(openai.BadRequestError, match=r"metadata\.sim must be a JSON object"):
            client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi"}],
                                           metadata={"sim": "{not json"})  # fmt: skip


def test_defaults_and_ids_as_vllm_reads_them(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    long = {"sim": {"output_tokens": 100}}
    with sdk(srv) as client:
        done = client.completions.create(model="sim-test", prompt="hello there", extra_body=long)
        assert done.usage is not None and done.usage.completion_tokens == 16  # CompletionRequest's default
        assert done.choices[0].finish_reason == "length"
        chat = client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5, max_completion_tokens=2, extra_body=long)  # fmt: skip
        assert chat.usage is not None and chat.usage.completion_tokens == 2  # max_completion_tokens wins
        named = client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2, extra_headers={"x-request-id": "req-42"})  # fmt: skip
        assert named.id == "chatcmpl-req-42"  # vLLM builds the id on the caller's X-Request-Id
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": None, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200 and r.json()["model"] == "sim-test"  # no model: the served one
    odd = httpx.post(f"{srv.url}/v1/chat/completions", headers={"x-request-id": 'a"b'},
                     json={"model": "sim-test", "max_tokens": 2, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert odd.status_code == 200 and 'a"b' not in odd.text  # an id unfit for JSON is replaced, not spliced in
    chat = {"model": "sim-test", "messages": [{"role": "user", "content": "hi"}], "sim": {"output_tokens": 100}}
    integral = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat, "max_tokens": 4.0, "seed": "7"})
    assert integral.status_code == 200 and integral.json()["usage"]["completion_tokens"] == 4  # pydantic's lax ints
    fraction = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat, "max_tokens": 4.5})
    assert fraction.status_code == 400 and fraction.json()["error"]["param"] == "max_tokens"
    assert "fractional part" in fraction.json()["error"]["message"]


def test_several_answers_n_and_a_batch_of_prompts(sim_server: SimServer, sim_profile: Profile) -> None:
    """As vLLM: one choice per answer (index = prompt x n + i), usage counting each prompt once."""
    srv = sim_server(profile=sim_profile())
    sim = {"sim": {"output_tokens": 6}}
    with sdk(srv) as client:
        one = client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi there"}],
                                             seed=3, extra_body=sim)  # fmt: skip
        chat = client.chat.completions.create(model="sim-test", messages=[{"role": "user", "content": "hi there"}],
                                              n=3, seed=3, extra_body=sim)  # fmt: skip
        assert [c.index for c in chat.choices] == [0, 1, 2] and all(c.finish_reason == "stop" for c in chat.choices)
        assert chat.choices[0].message.content == one.choices[0].message.content  # the first answer: as n=1's
        assert len({c.message.content for c in chat.choices}) == 3  # the others: their own draws
        assert chat.usage is not None and one.usage is not None
        assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (one.usage.prompt_tokens, 18)
        batch = client.completions.create(model="sim-test", prompt=["a b c", "d e f g"], n=2, max_tokens=4,
                                          extra_body=sim)  # fmt: skip
        assert [c.index for c in batch.choices] == [0, 1, 2, 3]
        assert all(c.finish_reason == "length" and len(c.text.split()) == 4 for c in batch.choices)
        assert batch.usage is not None and batch.usage.completion_tokens == 16
        solo = [client.completions.create(model="sim-test", prompt=p, max_tokens=4, extra_body=sim).usage
                for p in ("a b c", "d e f g")]  # fmt: skip
        assert batch.usage.prompt_tokens == sum(u.prompt_tokens for u in solo if u is not None)
        # streamed: every choice's tokens, its finish, then one usage chunk and the end
        got: dict[int, list[str]] = {}
        finish: dict[int, str] = {}
        usage = None
        for chunk in client.chat.completions.create(model="sim-test", n=2, stream=True, extra_body=sim,
                                                    messages=[{"role": "user", "content": "hi there"}],
                                                    stream_options={"include_usage": True}):  # fmt: skip
            usage = chunk.usage or usage
            for c in chunk.choices:
                got.setdefault(c.index, []).append(c.delta.content or "")
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        assert sorted(got) == [0, 1] and finish == {0: "stop", 1: "stop"}
        assert all(len("".join(parts).split()) == 6 for parts in got.values())
        assert usage is not None and usage.completion_tokens == 12
    m = metrics(srv)
    assert m["vllm:request_success_total"] == 1 + 3 + 4 + 2 + 2  # one engine request per answer


# -- physics --------------------------------------------------------------------------------------
def test_ttft_grows_with_prompt_length(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(step_time_s={"prefill_tokens": 1e-4}), speedup=2.0)
    with sdk(srv) as client:
        short, _, _ = stream_timing(client, words(20, "s"), 2)
        long, _, _ = stream_timing(client, words(4000, "l"), 2)  # ~0.2 s of prefill at speedup 2
    assert long > short + 0.1


@pytest.mark.quiet
def test_tpot_grows_with_batch_size(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(step_time_s={"decode_seqs": 1e-3}), speedup=2.0)
    with sdk(srv) as client:

        def tpot(k: int) -> float:
            ttft, e2e, n = stream_timing(client, f"batch request {k}", 40)
            return (e2e - ttft) / (n - 1)

        alone = tpot(0)
        with ThreadPoolExecutor(24) as pool:
            crowded = list(pool.map(tpot, range(1, 25)))
    # one decoding seq: ~2.5 ms a step; 24 of them: ~14 ms a step (speedup 2)
    assert sorted(crowded)[len(crowded) // 2] > 2 * alone


def test_prefix_cache_lowers_ttft_of_a_repeated_prompt(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(step_time_s={"prefill_tokens": 1e-4}), speedup=2.0)
    prompt = words(3000, "ctx")
    with sdk(srv) as client:
        cold, _, _ = stream_timing(client, prompt, 2)
        warm, _, _ = stream_timing(client, prompt + " and a follow up", 2)
    m = metrics(srv)
    assert warm < cold / 3
    assert m["vllm:prefix_cache_hits_total"] >= 2992
    assert m["vllm:prefix_cache_queries_total"] == 3000 + 3004


@pytest.mark.parametrize(("kind", "hits"), [("words", 0), ("wordlevel", 496)])
def test_word_level_tokenizer_makes_english_prompts_share_a_prefix(
    sim_server: SimServer, sim_profile: Profile, kind: str, hits: int
) -> None:
    # Real vLLM with the H200 test models' tokenizer sees both prompts as runs of <unk>: the second
    # (502 tokens: role, 500 words, the template's "assistant") hits the first's 31 full blocks.
    srv = sim_server(profile=sim_profile(tokenizer={"kind": kind}), speedup=5.0)
    with sdk(srv) as client:
        for tag in ("alpha", "beta"):
            client.chat.completions.create(
                model="sim-test", messages=[{"role": "user", "content": words(500, tag)}], max_tokens=2
            )
    m = metrics(srv)
    assert m["vllm:prefix_cache_queries_total"] == 2 * (501 if kind == "words" else 502)
    assert m["vllm:prefix_cache_hits_total"] == hits


def test_a_workflow_step_reuses_the_transcript_in_full_blocks_not_the_earlier_answer(
    sim_server: SimServer, sim_profile: Profile
) -> None:
    # The bench's workflows (chimera_bench/workloads.py): each step sends the transcript so far with its own
    # instruction last, and the next step puts the answer where that instruction was. As in vLLM, only full
    # 16-token blocks of the common prefix are found; the answer, cached after the instruction, is found
    # only by the step after next, which resends it at the same position (as vLLM 0.26 does on an H200).
    srv = sim_server(profile=sim_profile(), speedup=5.0)
    system = {"role": "system", "content": words(100, "sys")}  # 101 tokens with the role
    task = {"role": "user", "content": words(60, "task")}  # 61
    transcript = [system, task]
    queries, answers = [], []
    with sdk(srv) as client:
        for step, out in enumerate((40, 30, 20)):
            messages = [*transcript, {"role": "user", "content": words(9, f"do{step}-")}]  # 10
            r = client.chat.completions.create(model="sim-test", messages=messages, max_tokens=out,
                                               extra_body={"sim": {"output_tokens": out}})  # fmt: skip
            answers.append(r.choices[0].message.content or "")
            queries.append(r.usage.prompt_tokens)
            transcript.append({"role": "assistant", "content": f"planner: {answers[-1]}"})  # 2 + out
    m = metrics(srv)
    assert queries == [172, 162 + 42 + 10, 162 + 42 + 32 + 10]
    assert m["vllm:prefix_cache_queries_total"] == sum(queries)
    # step 2 finds 162 // 16 blocks of system + task; step 3 finds step 2's prompt up to its instruction,
    # first answer included: (162 + 42) // 16 blocks
    assert m["vllm:prefix_cache_hits_total"] == 16 * (162 // 16) + 16 * ((162 + 42) // 16)


@pytest.mark.quiet  # (twelve requests must reach the sim together: a busy machine staggers them)
def test_kv_exhaustion_queues_and_preempts(sim_server: SimServer, sim_profile: Profile) -> None:
    # 40 blocks of KV: three 200-token prompts fill it, and their growth forces preemptions.
    srv = sim_server(profile=sim_profile(kv_budget_tokens=16 * 40), speedup=2.0)
    seen_waiting, seen_full = 0.0, 0.0
    with sdk(srv) as client, ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(stream_timing, client, words(200, f"q{k}-"), 100) for k in range(12)]
        while not all(f.done() for f in futures):
            m = metrics(srv)
            seen_waiting = max(seen_waiting, m["vllm:num_requests_waiting"])
            seen_full = max(seen_full, m["vllm:kv_cache_usage_perc"])
            time.sleep(0.02)
        assert all(f.result()[2] == 100 for f in futures)
    m = metrics(srv)
    assert seen_waiting > 0 and seen_full > 0.8
    assert m["vllm:num_preemptions_total"] > 0
    assert m["vllm:generation_tokens_total"] == 12 * 100
    assert m["vllm:kv_cache_usage_perc"] == 0.0 and m["vllm:num_requests_running"] == 0


@pytest.mark.parametrize("n", [1, 3])
def test_client_disconnect_aborts_the_request(sim_server: SimServer, sim_profile: Profile, n: int) -> None:
    srv = sim_server(profile=sim_profile(), speedup=1.0)
    body = {"model": "sim-test", "prompt": words(500), "max_tokens": 4000, "stream": True, "n": n,
            "sim": {"output_tokens": 4000}}  # fmt: skip
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{srv.url}/v1/completions", json=body) as r:
        chunks = r.iter_raw()
        assert b'"text"' in next(chunks)  # the stream is open and generating
        assert metrics(srv)["vllm:num_requests_running"] == n  # every answer a request of its own
    deadline = time.monotonic() + 5
    while metrics(srv)["vllm:num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    m = metrics(srv)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0
    assert m["vllm:generation_tokens_total"] < 4000
