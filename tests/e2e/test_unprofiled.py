"""Workers whose model the router has never seen, with no profile: through the real gateway, two simulated
workers (a 0.5B's and a 14B's step times under made-up model names), the official openai SDK and
``/v1/feedback``. Each worker's step times are learned from its own answers, and its answer quality from the
verdicts, until the policy routes on what they are rather than on the default profile's guess."""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Callable
from typing import Any

import httpx
import openai

from predictor.prior import profile_for
from tests.conftest import ServerThread, make_config

Start = Callable[..., ServerThread]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def test_unknown_workers_learn_their_step_times_and_quality(sim_server: Start, gateway_server: Start) -> None:
    fast = sim_server(model="mystery-small", profile="h200-qwen2.5-0.5b", speedup=2.0)
    slow = sim_server(model="mystery-large", profile="h200-qwen2.5-14b", speedup=2.0)
    backends = [{"name": "small", "url": fast.url, "model": "mystery-small"},
                {"name": "large", "url": slow.url, "model": "mystery-large"}]  # fmt: skip
    cfg = make_config(backends, policy="round_robin")
    gw = gateway_server(cfg.model_copy(update={"gateway": cfg.gateway.model_copy(update={"policy": "predictive"})}))
    http = httpx.Client(base_url=gw.url, timeout=30.0)

    def fleet() -> dict[str, dict[str, Any]]:
        return {b["name"]: b for b in http.get("/fleet").json()["backends"]}

    before = fleet()
    assert before["small"]["profile"] == "learned:small" and before["small"]["learned_answers"] == 0
    # both start from the same guess: nothing tells them apart yet
    assert before["small"]["predicted_tpot_ms"] == before["large"]["predicted_tpot_ms"]
    assert before["small"]["quality"] == before["large"]["quality"] == 1.0  # untried: optimistic

    rng = random.Random(3)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)

    def ask(backend: str | None = None) -> tuple[str, str]:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 600)))
        raw = client.chat.completions.with_raw_response.create(
            model="mystery-small" if backend == "small" else "mystery-large" if backend == "large" else "auto",
            messages=[{"role": "user", "content": prompt}], max_tokens=48, stream=True,
            stream_options={"include_usage": True}, extra_body={"sim": {"output_tokens": 48}},
        )  # fmt: skip
        for _ in raw.parse():
            pass
        return raw.headers["x-chimera-backend"], raw.headers["x-request-id"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # some load, so batches vary
        answers = list(pool.map(ask, ["small", "large"] * 24))
    for backend, rid in answers:  # the small model's answers are all wrong, the large one's right
        r = http.post("/v1/feedback", json={"request_id": rid, "correct": backend == "large"})
        assert r.status_code == 200, r.text
    after = fleet()
    client.close()
    for name in ("small", "large"):
        assert after[name]["learned_answers"] == 24 and after[name]["learned_fits"] >= 1
        assert after[name]["verdicts"] == 24
    assert after["small"]["quality"] < 0.2 < 0.9 < after["large"]["quality"]
    # each worker's decode step, as the sims run it (an idle step at speedup 2), where the guess had them equal
    for name, shape in (("small", "h200-qwen2.5-0.5b"), ("large", "h200-qwen2.5-14b")):
        truth = profile_for(shape, time_scale=0.5)
        step_ms = (truth.base + truth.decode_seqs) * 1e3
        assert 0.6 < after[name]["predicted_tpot_ms"] / step_ms < 1.6, (name, after[name], step_ms)
    # and what the policy does with it: a model whose answers fail loses the requests it could serve faster
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as c2:
        client = c2
        assert [ask()[0] for _ in range(3)] == ["large"] * 3
    http.close()
