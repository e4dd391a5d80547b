#!/usr/bin/env python3
"""A local multiple-choice task for lm-evaluation-harness, built from the committed Shakespeare slice: each item is
two consecutive lines of verse and four candidates for the next line (the true one and three drawn from elsewhere
in the text, in a seeded order). Writes OUT/shakespeare_mc.jsonl and the task's YAML (OUT/ember_shakespeare_mc.yaml)
for `lm_eval --include_path OUT --tasks ember_shakespeare_mc`.

    python3 scripts/lm-eval/task.py tests/fixtures/shakespeare-100k.txt OUT [ITEMS]
"""
import json
import os
import random
import sys


def main(corpus, out, items=300):
    lines = [line.strip() for line in open(corpus, encoding="utf-8")]
    # Verse lines of a usable length, each with the two lines before it in the same speech.
    usable = [i for i in range(2, len(lines))
              if all(20 <= len(lines[j]) <= 80 and not lines[j].endswith(":") for j in (i - 2, i - 1, i))]
    rng = random.Random(0)
    chosen = rng.sample(usable, items)
    pool = sorted({lines[i] for i in usable})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "shakespeare_mc.jsonl"), "w") as f:
        for i in chosen:
            wrong = [c for c in rng.sample(pool, 8) if c != lines[i]][:3]
            choices = wrong + [lines[i]]
            rng.shuffle(choices)
            f.write(json.dumps({"context": lines[i - 2] + "\n" + lines[i - 1] + "\n", "choices": choices,
                                "answer": choices.index(lines[i])}) + "\n")
    with open(os.path.join(out, "ember_shakespeare_mc.yaml"), "w") as f:
        f.write(f"""task: ember_shakespeare_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {os.path.abspath(os.path.join(out, "shakespeare_mc.jsonl"))}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
