"""Give the H200 test models a tokenizer in which every word the bench sends is its own token.

    python3 scripts/calibrate/bench_vocab.py /tmp/models      # after ../shared/gpu/mkmodels.py

`mkmodels.py` writes a word-level vocabulary of ``w3`` ... ``w<vocab - 1>``; the bench's prompts are English
words, so real vLLM saw every bench prompt as a run of ``<unk>`` and its prefix cache hit 87-95 % of the
chat prompt tokens (docs/REAL_VLLM.md, "Rerun 3"). This rewrites each model's tokenizer (config and weights
untouched) so that each distinct word of the bench's workloads (system preambles, tasks, instructions,
role prefixes, the verdict markers) gets an id of its own, taken from the top of the vocabulary (those
``w<id>`` names are dropped, so decoding and re-encoding still round-trip). Then real prompts share
exactly the prefixes that the sim's own tokenizer (one token per distinct word) says they share, and the
sim runs with ``real_vllm.py configs --tokenizer words``. `h200_validate.sh` runs it when BENCH_VOCAB=1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router.bench.workloads import CORRECT, DETAIL, ROLES, WORKLOADS, make_workflow  # noqa: E402


def bench_words(seeds: int = 4, per_seed: int = 600) -> list[str]:
    """Every word the bench's requests can contain, apart from the model's own answers (``w<id>``)."""
    words: set[str] = {"system", "user", "assistant", CORRECT, "[wrong]"}
    for role, spec in ROLES.items():
        words.add(f"{role}:")
        for detail, _, _ in DETAIL:
            words.update((spec.instruction + (f" Answer {detail}." if detail else "")).split())
    for workload in WORKLOADS:
        for seed in range(seeds):
            for i in range(per_seed):
                step = make_workflow(workload, seed, i).next_step()
                assert step is not None
                for m in step.messages:
                    words.update(m["content"].split())
    return sorted(words)


def rewrite(model_dir: Path, words: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    top = size - len(words)
    vocab.update({f"w{i}": i for i in range(3, top)})
    vocab.update({w: top + k for k, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}assistant"
    fast.save_pretrained(model_dir)
    tc = model_dir / "tokenizer_config.json"
    cfg = json.loads(tc.read_text())
    cfg["tokenizer_class"] = "TokenizersBackend"  # as mkmodels.py
    tc.write_text(json.dumps(cfg))
    print(f"{model_dir}: {len(words)} bench words at ids {top}..{size - 1}")


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/models")
    words = bench_words()
    for d in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        rewrite(d, words)


if __name__ == "__main__":
    main()
