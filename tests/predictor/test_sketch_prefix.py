"""Text sketch, prefix hashes and the gateway's prefix index."""

from __future__ import annotations

import numpy as np

from predictor.prefix import PrefixIndex
from predictor.sketch import (
    N_TERMS,
    SKETCH_DIM,
    WORDS_PER_BLOCK,
    prefix_hashes,
    prompt_text,
    sketch,
    task_text,
    text_features,
)
from predictor.window import TrainingWindow

WORDS = " ".join(f"w{i}" for i in range(200))


def test_prompt_text_follows_the_simulators_chat_layout() -> None:
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi there"}]}]}  # fmt: skip
    assert prompt_text("chat", body) == "system be brief user hi there"
    assert prompt_text("completions", {"prompt": ["a b", "c"]}) == "a b c"
    assert prompt_text("completions", {"prompt": [1, 2, 3]}) == ""


def test_sketch_is_normalised_deterministic_and_bounded() -> None:
    a = np.asarray(sketch("Write the code thoroughly"))
    assert a.shape == (SKETCH_DIM,) and abs(np.linalg.norm(a) - 1) < 1e-9
    assert sketch("write THE code thoroughly") == tuple(a.tolist())  # lower-cased
    assert sketch("") == (0.0,) * SKETCH_DIM
    assert len(sketch("word " * 100_000)) == SKETCH_DIM


def test_task_terms_read_the_first_user_message_and_the_tail() -> None:
    body = {"messages": [{"role": "system", "content": "charter " + "team preamble " * 50},
                         {"role": "user", "content": "Task: implement a compiler module"},
                         {"role": "assistant", "content": "coder: tok1 tok2 [wrong]"},
                         {"role": "user", "content": "As the tester, report."}]}  # fmt: skip
    assert task_text("chat", body) == "Task: implement a compiler module"
    assert task_text("chat", {"messages": [{"role": "system", "content": "x"}]}) == ""
    text = prompt_text("chat", body)
    dense, terms = text_features(text, task_text("chat", body))
    assert dense == sketch(text)  # the same sketch as before, from the same vectorizer call
    assert list(terms) == sorted(set(terms)) and all(0 <= t < N_TERMS for t in terms)
    _, compiler = text_features("", "compiler")
    _, wrong = text_features("", "[wrong]")
    assert set(compiler) <= set(terms) and set(wrong) <= set(terms)  # the topic and the tail's verdict
    _, charter = text_features("", "charter")
    assert not set(charter) <= set(terms)  # the system preamble's head is not the task


def test_prefix_hashes_are_chained_over_full_blocks() -> None:
    h = prefix_hashes(WORDS)
    assert len(h) == 200 // WORDS_PER_BLOCK
    changed = prefix_hashes(WORDS.replace("w40 ", "zz "))  # in block 2
    assert changed[:2] == h[:2] and all(a != b for a, b in zip(changed[2:], h[2:], strict=True))
    assert prefix_hashes("too short") == ()


def test_prefix_index_matches_longest_prefix_per_worker_and_is_bounded() -> None:
    idx = PrefixIndex(capacity=20, ways=2)
    h = prefix_hashes(WORDS)
    idx.record(h[:4], "a")
    idx.record(h, "b")
    assert idx.match(h) == {"a": 4, "b": len(h)}
    shares = idx.shares(h, 400)
    assert shares["a"] == 4 * WORDS_PER_BLOCK / 400 and shares["b"] == len(h) * WORDS_PER_BLOCK / 400
    idx.record(h[:1], "c")  # ways=2: block 0 forgets "a"; its deeper (chained) blocks still vouch for it
    assert idx.match(h) == {"a": 4, "b": len(h), "c": 1}
    idx.record(prefix_hashes(" ".join(f"x{i}" for i in range(800))), "d")
    assert len(idx) == 20


def test_prefix_index_reports_how_deep_the_news_goes() -> None:
    idx = PrefixIndex()
    h = prefix_hashes(WORDS)
    assert idx.record(h[:3], "a") == 3  # all new
    assert idx.record(h[:3], "a") == 0  # nothing changed: nothing to tell other gateways
    assert idx.record(h, "a") == len(h)  # deeper blocks are new: the chain up to them, head included
    assert idx.record(h[:2], "b") == 2  # now last seen on another worker
    assert idx.record(h[:2], "a") == 2  # and back
    assert idx.match(h) == {"a": len(h), "b": 2}


def test_window_keeps_rare_load_regimes() -> None:
    w = TrainingWindow(capacity=100)
    for i in range(10):
        w.add({"i": i, "fleet": {"inflight_requests": 50}})  # a burst, long ago
    for i in range(500):
        w.add({"i": i, "fleet": {"inflight_requests": 0}})
    assert len(w) == 100 and w.added == 510
    assert sum(1 for r in w.records() if r["fleet"]["inflight_requests"] == 50) == 10
