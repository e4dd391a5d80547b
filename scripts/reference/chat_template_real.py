#!/usr/bin/env python3
"""Real models' chat templates rendered by Hugging Face transformers' apply_chat_template machinery, for Ember's
renderer to equal byte for byte. The templates are llama.cpp's collection (models/templates/*.jinja in the
llama-cpp-python 0.3.36 sdist; scripts/prepare-data.sh chat-templates fetches them into data/chat-templates/, as they
are third-party files and not committed); this writes only the rendered strings, keyed by file name.

    python3 scripts/reference/chat_template_real.py data/chat-templates crates/formats/tests/fixtures/chat_templates_real.json

Each template renders three chats (a user turn; a system prompt and two turns; a system prompt, a tool result and a
user turn) with the generation prompt, with bos_token "<|bos|>" and eos_token "<|eos|>", at a fixed time. A template
that fails in transformers is recorded with its error, so Ember must fail it too.
Needs transformers and jinja2.
"""
import datetime
import json
import sys
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils

NOW = datetime.datetime(2026, 3, 7, 9, 5, 3)


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


chat_template_utils.datetime = FixedDatetime

CHATS = {
    "user": [{"role": "user", "content": "Hello! What is 2 + 2?"}],
    "system and turns": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one, please."},
    ],
    "tool result": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "tool", "content": "{\"temperature\": 18}"},
        {"role": "user", "content": "Thanks. Summarise."},
    ],
}


def main():
    templates, out = Path(sys.argv[1]), sys.argv[2]
    renders = {}
    for path in sorted(templates.glob("*.jinja")):
        cases = {}
        for chat, messages in CHATS.items():
            try:
                text = chat_template_utils.render_jinja_template(
                    conversations=[messages], chat_template=path.read_text(), add_generation_prompt=True,
                    bos_token="<|bos|>", eos_token="<|eos|>")[0][0]
                cases[chat] = {"rendered": text}
            except Exception as e:  # what transformers refuses, Ember must refuse too
                cases[chat] = {"error": f"{type(e).__name__}: {e}"}
        renders[path.name] = cases
    fixture = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "now": NOW.isoformat(),
               "bos_token": "<|bos|>", "eos_token": "<|eos|>", "chats": CHATS, "renders": renders}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(renders)} templates × {len(CHATS)} chats to {out}")


main()
