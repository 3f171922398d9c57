"""Tokenizer stand-in and the answer draws: deterministic, and harder means wrong more often."""

from __future__ import annotations

from backends.sim.textgen import (
    CORRECT,
    VOCAB_IDS,
    WRONG,
    Tokenizer,
    chat_text,
    draw_answer,
    p_correct,
    pieces,
    tokenize,
)
from router.core.profile import available_profiles, load_profile
from tests import qwen_bpe
from tests.multilingual import EN, JA, KO, ZH


def test_one_token_per_word_stable_ids() -> None:
    assert len(tokenize("  a b\tc\nd ")) == 4
    assert tokenize("same words") == tokenize("same   words")
    assert tokenize("x") == [2363233923]  # CRC-32, the same in every process


def test_cjk_runs_are_cut_at_a_bpe_rate_deterministically() -> None:
    # a run of n Han characters is max(1, round(0.64 n)) tokens; a CJK punctuation mark is one
    assert pieces("你好，世界。") == ["你好", "，", "世界", "。"]  # noqa: RUF001
    assert len(tokenize("一个典型的多智能体应用")) == 7  # 11 characters
    assert pieces("Python代码 hello") == ["Python", "代码", "hello"]  # the Latin part of a word stays one token
    assert len(tokenize("こんにちは")) == 3 and len(tokenize("안녕하세요")) == 4
    zh = "".join(ZH)
    assert tokenize(zh) == tokenize(zh) and len(tokenize(zh)) > 300  # it was 1 token: no spaces in it
    assert tokenize(zh[:100])[:50] == tokenize(zh)[:50]  # a shared prefix keeps its ids (the prefix cache sees it)
    a, b = tokenize("今天天气很好"), tokenize("今天天气不好")
    assert a != b and len(a) == len(b)
    assert len(tokenize(" ".join(EN))) == len(" ".join(EN).split())  # English: one token a word, as before


def test_cjk_counts_are_near_qwen2_5s() -> None:
    """On the fixtures' prose, the sim's count of each language within 20 % of Qwen2.5's (the rates were fitted on
    a larger, more technical corpus: the module's docstring)."""
    for texts in (ZH, JA, KO):
        sim, real = sum(len(tokenize(t)) for t in texts), sum(qwen_bpe.tokens(t) for t in texts)
        assert abs(sim - real) <= 0.2 * real, (sim, real)


def test_chat_text_joins_roles_and_contents() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_text(msgs) == "system be brief user hi"


def test_draws_depend_on_seed_and_prompt_not_on_order() -> None:
    a = draw_answer(0, "m", "prompt one", 0.6, None, 0.5)
    assert a == draw_answer(0, "m", "prompt one", 0.6, None, 0.5)
    others = {draw_answer(s, "m", "prompt one", 0.6, None, 0.5) for s in range(1, 20)}
    assert len(others) > 1 and a.marker in (CORRECT, WRONG)
    assert draw_answer(0, "m", "p", 0.6, 42, None) == draw_answer(0, "m", "p", 0.6, 42, None)
    assert draw_answer(0, "m", "p", 0.6, 42, None).marker is None


def test_default_length_distribution_is_plausible() -> None:
    lengths = sorted(draw_answer(0, "m", f"q{i}", 0.5, None, None).natural_tokens for i in range(2000))
    median = lengths[len(lengths) // 2]
    assert 100 <= median <= 220 and lengths[0] >= 1


def test_harder_tasks_fail_more_often_on_smaller_profiles() -> None:
    profiles = sorted((load_profile(n) for n in available_profiles()), key=lambda p: p.quality)
    weakest, strongest = profiles[0], profiles[-1]
    assert weakest.quality < strongest.quality

    def success(quality: float, model: str, difficulty: float) -> float:
        draws = [draw_answer(7, model, f"task {i}", quality, 10, difficulty) for i in range(3000)]
        return sum(d.marker == CORRECT for d in draws) / len(draws)

    for d in (0.2, 0.5, 0.8):
        weak, strong = success(weakest.quality, weakest.model, d), success(strongest.quality, strongest.model, d)
        assert weak < strong
        assert abs(weak - p_correct(weakest.quality, d)) < 0.04
    assert success(weakest.quality, weakest.model, 0.9) < success(weakest.quality, weakest.model, 0.1)


def test_wordlevel_tokenizer_is_the_test_models_vocabulary() -> None:
    tok = Tokenizer("wordlevel", vocab_size=151936)
    # in the vocabulary: w3 .. w151935, spelled without leading zeros; everything else is <unk> = 0
    assert tok.encode("w3 w17 w151935 w151936 w2 w012 hello [correct]") == [3, 17, 151935, 0, 0, 0, 0, 0]
    # the sim's own answer words stand for the real models' noise words: distinct, not <unk>
    assert tok.encode("tok5 tok6") == [VOCAB_IDS[5], VOCAB_IDS[6]]
    # the chat template "{role} {content} ... assistant": one more token, and English is all <unk>
    text = chat_text([{"role": "user", "content": "the cache"}])
    assert tok.encode_chat(text) == [0, 0, 0, 0]
    assert Tokenizer().encode_chat(text) == tokenize(text)
