#!/usr/bin/env python3
"""Chat templates rendered by Hugging Face transformers' apply_chat_template machinery
(transformers.utils.chat_template_utils.render_jinja_template), for Ember's chat-template renderer to equal byte for
byte, at a fixed time for strftime_now.

    python3 scripts/reference/chat_templates.py fixture crates/formats/tests/fixtures/chat_templates.json [GGUF]
    python3 scripts/reference/chat_templates.py real data/chat-templates crates/formats/tests/fixtures/chat_templates_real.json
    python3 scripts/reference/chat_templates.py masks data/chat-templates data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        crates/core-model/tests/fixtures/assistant_masks.json

fixture: SmolLM2-135M-Instruct's template (from its GGUF file's tokenizer.chat_template, or the copy below when no
file is given) and templates written to use every feature transformers adds or Jinja offers that model templates
rely on (whitespace control under trim_blocks/lstrip_blocks, Python string methods, namespace(), loop variables,
slicing, tojson with its options, strftime_now, raise_exception, bos_token/eos_token), over four chats with and
without the generation prompt; the templates are written into the fixture.

real: the real templates of llama.cpp's collection (models/templates/*.jinja in the llama-cpp-python 0.3.36 sdist;
scripts/prepare-data.sh chat-templates fetches them, as they are third-party files and not committed) over four chats
(a user turn; a system prompt and two turns; a system prompt, a tool result and a user turn; a tool call and its
result, with the request's tools) with the generation prompt; only the rendered strings are written, keyed by file name. A template that fails in transformers is recorded
with its error, so Ember must fail it too.

masks: transformers' assistant-token masks (apply_chat_template(..., return_assistant_tokens_mask=True)) for the real
templates that mark the assistant's text with {% generation %}, over three chats that end with the assistant's reply,
tokenized with SmolLM2-135M-Instruct's tokenizer (from its GGUF file).

Needs transformers and jinja2 (pip install transformers jinja2; gguf to read a template from a GGUF file).
"""
import datetime
import json
import re
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

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The shape of Llama 3.1's template: a dated system header, trimmed contents, roles checked.
DATED = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant'] %}
        {{- raise_exception('Conversation roles must be user or assistant, not ' + message.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Block tags on their own lines (trim_blocks and lstrip_blocks at work), Python methods, namespace, tojson.
PYTHONIC = """{% set ns = namespace(bangs=0) %}
{% for m in messages %}
    {% if m.content.startswith('!') %}
        {% set ns.bangs = ns.bangs + 1 %}
    {% endif %}
    [{{ m.role.upper() }} {{ loop.index }}/{{ loop.length }}] {{ m.content.strip().replace('\\n', ' / ') }}
    {{ m | tojson }}
{% endfor %}
{{ messages | tojson(indent=2) }}
{{ messages[-1] | tojson(ensure_ascii=true, sort_keys=true) }}
{{ messages[0] | tojson(separators=[',', ':']) }}
{% for key, value in messages[0].items() %}{{ key }}={{ value }};{% endfor %}

bangs={{ ns.bangs }} words={{ messages[-1].content.split() | length }} {{ messages[0].get('name', 'anonymous') }}
{{- eos_token if not add_generation_prompt }}
{% if add_generation_prompt %}<assistant>{% endif %}
"""

SYNTAX_ERROR = "{% for m in messages %}{{ m.content }"

FIXTURE_CHATS = {
    "one user turn": [{"role": "user", "content": "What is the capital of France?"}],
    "with a system prompt": [
        {"role": "system", "content": "  You answer in one word.  "},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima"},
        {"role": "user", "content": "!And of Chile?\nPlease."},
    ],
    "unicode, quotes and keys in their own order": [
        {"role": "user", "content": 'Zürich says "grüezi" — 日本語 🙂 \\ tab\there', "name": "ueli", "weight": 1.0,
         "tags": ["a", 2, None, True, {"z": 0.1, "a": 1e-7}]},
    ],
    "a tool role": [
        {"role": "user", "content": "Weather?"},
        {"role": "tool", "content": "sunny"},
    ],
}


def render_case(template, messages, add_generation_prompt):
    try:
        return {"rendered": chat_template_utils.render_jinja_template(
            conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt,
            bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")[0][0]}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"syntax_error": str(e)}
    except jinja2.exceptions.TemplateError as e:
        return {"refused": str(e)}


# The tools of the "tool calls" chat, as a request's `tools` lists them.
REAL_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"]}}}]

REAL_CHATS = {
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
    # OpenAI's form: the call's arguments a JSON string (Ember, as vLLM, parses it into the object templates expect).
    "tool calls": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18}"},
    ],
}

# Chats that end with the assistant's turn, for training masks.
MASK_CHATS = {
    "one turn": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
    ],
    "two turns": [
        {"role": "user", "content": "Hello! What is 2 + 2?"},
        {"role": "assistant", "content": "4, of course."},
        {"role": "user", "content": "And 3 × 3?"},
        {"role": "assistant", "content": "9 — é, ü and 漢字 too."},
    ],
    "tool call": REAL_CHATS["tool calls"] + [{"role": "assistant", "content": "It is 18 °C in Paris."}],
}


def as_template_sees(messages):
    """OpenAI messages with each tool call's arguments parsed from their JSON string."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def fixture(out, gguf=None):
    smollm2 = SMOLLM2
    if gguf:
        from gguf import GGUFReader
        field = GGUFReader(gguf).fields["tokenizer.chat_template"]
        smollm2 = bytes(field.parts[field.data[0]]).decode()
    templates = {"smollm2": smollm2, "dated": DATED, "pythonic": PYTHONIC, "syntax error": SYNTAX_ERROR}
    cases = []
    for name, template in templates.items():
        for chat, messages in FIXTURE_CHATS.items():
            for add in (True, False):
                case = {"template": name, "chat": chat, "add_generation_prompt": add}
                case.update(render_case(template, messages, add))
                cases.append(case)
    fixture = {
        "transformers": transformers.__version__, "jinja2": jinja2.__version__, "now": NOW.isoformat(),
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "templates": templates, "chats": FIXTURE_CHATS,
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


def masks(templates, gguf, out):
    """transformers' assistant-token masks (return_assistant_tokens_mask) for every template that marks the
    assistant's text with {% generation %}, over MASK_CHATS, tokenized with SmolLM2's tokenizer."""
    folder, name = Path(gguf).resolve().parent, Path(gguf).name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cases = []
    for path in sorted(Path(templates).glob("*.jinja")):
        template = path.read_text()
        if not re.search(r"{%[-+]?\s*generation\s*[-+]?%}", template):
            continue
        for chat, messages in MASK_CHATS.items():
            tools = REAL_TOOLS if chat == "tool call" else None
            out_ = tok.apply_chat_template(as_template_sees(messages), chat_template=template, tools=tools,
                                           tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                           add_generation_prompt=False)
            rendered = tok.apply_chat_template(as_template_sees(messages), chat_template=template, tools=tools,
                                               tokenize=False, add_generation_prompt=False)
            cases.append({"template": path.name, "chat": chat, "rendered": rendered,
                          "input_ids": list(out_["input_ids"]), "assistant_masks": list(out_["assistant_masks"])})
    fixture = {"transformers": transformers.__version__, "now": NOW.isoformat(), "bos_token": tok.bos_token or "",
               "eos_token": tok.eos_token or "", "chats": MASK_CHATS, "tools": REAL_TOOLS, "cases": cases}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} masks to {out}")


def real(templates, out):
    templates = Path(templates)
    renders = {}
    for path in sorted(templates.glob("*.jinja")):
        cases = {}
        for chat, messages in REAL_CHATS.items():
            try:
                tools = REAL_TOOLS if chat == "tool calls" else None
                text = chat_template_utils.render_jinja_template(
                    conversations=[as_template_sees(messages)], chat_template=path.read_text(), tools=tools,
                    add_generation_prompt=True, bos_token="<|bos|>", eos_token="<|eos|>")[0][0]
                cases[chat] = {"rendered": text}
            except Exception as e:  # what transformers refuses, Ember must refuse too
                cases[chat] = {"error": f"{type(e).__name__}: {e}"}
        renders[path.name] = cases
    fixture = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "now": NOW.isoformat(),
               "bos_token": "<|bos|>", "eos_token": "<|eos|>", "chats": REAL_CHATS, "tools": REAL_TOOLS,
               "renders": renders}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(renders)} templates × {len(REAL_CHATS)} chats to {out}")


if __name__ == "__main__":
    commands = {"fixture": fixture, "real": real, "masks": masks}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
