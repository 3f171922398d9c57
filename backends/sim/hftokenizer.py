"""A Hugging Face tokenizer whose token counts the simulated worker agrees with, for the clients that need one.

Benchmark clients (guidellm, aiperf, vLLM's ``benchmark_serving``) load a tokenizer by name to cut their
synthetic prompts to ``N`` tokens from a text corpus, then decode them; against the simulated workers no
published tokenizer agrees with the sim, which counts one token per whitespace-separated word. This one
lowercases, cuts every word into runs of up to three letters, each other character on its own (``"Hello,"``:
``hel`` ``lo`` ``,``), and decodes with a space between tokens: a prompt a client cuts to ``N`` tokens is
``N`` words, ``N`` prompt tokens in the sim's ``usage``, and prompts cut from different text stay different
(the sim's prefix cache sees what a real one would). :func:`write` (``python -m backends.sim.hftokenizer DIR``)
puts ``tokenizer.json`` and ``tokenizer_config.json`` in a folder: plain JSON, without the tokenizers library.
For ASCII text only: a CJK character is one ``<unk>`` here, where the sim counts a run of them at a BPE
tokenizer's rate (:mod:`backends.sim.textgen`).
"""

from __future__ import annotations

import itertools
import json
import string
from pathlib import Path

UNK = "<unk>"  # not a special token: a client's decode with ``skip_special_tokens`` keeps it as a word
SPECIALS = ("<s>", "</s>")
PIECE = r"[a-z]{1,3}|[^a-z\s]"


def vocabulary() -> list[str]:
    letters = string.ascii_lowercase
    runs = ("".join(p) for n in (1, 2, 3) for p in itertools.product(letters, repeat=n))
    others = (c for c in string.digits + string.punctuation)
    return [UNK, *SPECIALS, *runs, *others]


def tokenizer_json() -> dict[str, object]:
    vocab = {w: i for i, w in enumerate(vocabulary())}
    added = [  # <unk> too, so that a decoded <unk> encodes back to one token
        {"id": vocab[w], "content": w, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": w != UNK}
        for w in (UNK, *SPECIALS)
    ]  # fmt: skip
    split = {"type": "Split", "pattern": {"Regex": PIECE}, "behavior": "Isolated", "invert": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, split]},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK},
    }


def write(folder: Path, max_model_len: int = 32768) -> None:
    """The tokenizer's files in ``folder`` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
              "model_max_length": max_model_len, "clean_up_tokenization_spaces": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


if __name__ == "__main__":  # python -m backends.sim.hftokenizer DIR
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m backends.sim.hftokenizer DIR")
    write(Path(sys.argv[1]))
