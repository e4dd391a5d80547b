#!/usr/bin/env python3
"""Exact match of a served model's greedy replies on held-out chats (scripts/sft/capitals.py's heldout.jsonl), through
the official `openai` client: a reply counts when it equals the held-out assistant message; a reply that ended on its
own (finish_reason "stop": the end-of-turn token) rather than at the length limit is counted too.

    python3 scripts/sft/exact_match.py http://127.0.0.1:8080/v1 heldout.jsonl
"""
import json
import sys

from openai import OpenAI


def main(base_url, path):
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    chats = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    exact = stopped = 0
    for chat in chats:
        prompt, answer = chat["messages"][:-1], chat["messages"][-1]["content"]
        reply = client.chat.completions.create(model=model, messages=prompt, temperature=0, max_tokens=24)
        text = reply.choices[0].message.content.strip()
        exact += text == answer
        stopped += reply.choices[0].finish_reason == "stop"
    print(f"exact match {exact}/{len(chats)} ({100 * exact / len(chats):.1f} %), ended at end-of-turn "
          f"{stopped}/{len(chats)}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
