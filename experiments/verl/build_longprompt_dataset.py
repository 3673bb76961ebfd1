"""Synthetic LongReason-style long-prompt dataset for veRL (parquet, veRL's RLHFDataset columns).

Each prompt is a long context — filler sentences with a handful of numeric facts scattered through it — followed
by a question whose answer needs several of those facts (sums and differences of quantities), so a policy must
read the whole context and reason over it, as in LongReason. Lengths are controlled in tokens: with
``--tokenizer`` (a local HF tokenizer folder) the context is grown until the chat-formatted prompt reaches
``--prompt-tokens``; without it, by a words-to-tokens estimate (1.3 tokens per word).

Columns: ``data_source`` ("dualkv/longprompt_synthetic"), ``prompt`` (chat messages), ``ability`` ("math"),
``reward_model`` ({"style": "rule", "ground_truth": "<int>"}), ``extra_info`` ({"index", "split", "facts"}).
Score with ``experiments/verl/reward.py`` (``reward.custom_reward_function.path=.../reward.py``).

    python experiments/verl/build_longprompt_dataset.py --out data/longprompt --prompt-tokens 8192 \\
        --num-train 4096 --num-val 128 [--tokenizer /models/Qwen3-8B]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DATA_SOURCE = "dualkv/longprompt_synthetic"
NAMES = ["Avery", "Blake", "Casey", "Devon", "Emery", "Finley", "Harper", "Jordan", "Kendall", "Logan", "Morgan",
         "Parker", "Quinn", "Reese", "Rowan", "Sawyer", "Skyler", "Taylor"]
ITEMS = ["apples", "books", "coins", "crates", "lamps", "marbles", "pencils", "shells", "stamps", "tickets"]
PLACES = ["the harbor", "the old mill", "the library", "the market", "the observatory", "the orchard",
          "the station", "the workshop"]
FILLER = [
    "The morning fog lifted slowly over {place}, and the streets filled with the sound of carts.",
    "Someone had painted the fence near {place} a pale shade of green during the previous week.",
    "A long discussion about the weather took place at {place}, though nobody reached a conclusion.",
    "The clock tower near {place} chimed twice, a little later than usual.",
    "Visitors to {place} often remarked on the smell of fresh bread drifting from a nearby bakery.",
    "Records kept at {place} describe a quiet season with few notable events.",
    "A stray cat wandered through {place}, inspected a pile of rope, and left without interest.",
    "The path to {place} was repaired after the rains, using stones carried from the river bed.",
]
INSTRUCTION = ("Read the notes above carefully. Answer the question using only facts stated in the notes. "
               "Think step by step, then give the final answer as an integer in the form \\boxed{N}.")


def make_example(rng: random.Random, words_budget: int, count_tokens=None, token_budget: int | None = None) -> dict:
    """One prompt: a long context with facts, a multi-fact question, and its integer answer."""
    people = rng.sample(NAMES, 4)
    item = rng.choice(ITEMS)
    amounts = {p: rng.randint(3, 90) for p in people}
    gift = rng.randint(1, min(amounts[people[1]], 20))
    facts = [f"{people[0]} keeps {amounts[people[0]]} {item} in a box at {rng.choice(PLACES)}.",
             f"{people[1]} owns {amounts[people[1]]} {item}, counted carefully at {rng.choice(PLACES)}.",
             f"{people[2]} collected {amounts[people[2]]} {item} over the summer.",
             f"Later, {people[1]} gave {gift} {item} to {people[2]}.",
             f"{people[3]} has {amounts[people[3]]} {item}, but they are not part of this story."]
    answer = amounts[people[0]] + (amounts[people[1]] - gift) + (amounts[people[2]] + gift)
    question = (f"Question: after the gift, how many {item} do {people[0]}, {people[1]} and {people[2]} have "
                "together?")
    sentences: list[str] = []

    def text() -> str:
        return " ".join(sentences) + "\n\n" + question + "\n" + INSTRUCTION

    def long_enough() -> bool:
        if count_tokens is not None:
            return count_tokens(text()) >= token_budget
        return len(text().split()) >= words_budget

    while not long_enough():
        sentences.append(rng.choice(FILLER).format(place=rng.choice(PLACES)))
    for fact in facts:                       # scatter the facts through the whole context
        sentences.insert(rng.randint(0, len(sentences)), fact)
    return {"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": text()}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)}, "facts": len(facts)}


def build(out: Path, num_train: int, num_val: int, prompt_tokens: int, tokenizer: str | None, seed: int) -> list[Path]:
    import pandas as pd

    count = None
    if tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
        count = lambda s: len(tok.apply_chat_template([{"role": "user", "content": s}], tokenize=True,  # noqa: E731
                                                      add_generation_prompt=True))
    words = max(16, int(prompt_tokens / 1.3))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", num_train), ("test", num_val)):
        rng = random.Random(f"{seed}-{split}")
        rows = []
        for i in range(n):
            ex = make_example(rng, words, count, prompt_tokens)
            ex["extra_info"] = {"index": i, "split": split, "facts": ex.pop("facts")}
            rows.append(ex)
        path = out / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    p.add_argument("--prompt-tokens", type=int, default=8192, help="target prompt length in tokens (default 8192)")
    p.add_argument("--num-train", type=int, default=4096)
    p.add_argument("--num-val", type=int, default=128)
    p.add_argument("--tokenizer", default=None, help="local HF tokenizer folder to measure prompts exactly")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for path in build(Path(args.out), args.num_train, args.num_val, args.prompt_tokens, args.tokenizer, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
