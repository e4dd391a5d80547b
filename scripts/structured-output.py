#!/usr/bin/env python3
"""Structured output through the official `openai` client against `ember serve`, checked with `jsonschema`: five
schemas (nested objects, enums, formats, nullable unions, $defs and $ref) × N prompts, each answered whole and
streamed (the deltas joined), every reply parsed and validated (formats checked too); `json_object` replies parsed;
tool calls with tool_choice required, named and none (each call's arguments valid against its function's schema, the
streamed deltas reassembled equal to the whole reply); then decoding speed with and without a schema at concurrency 1, and the server's own count and mean time of grammar
compilations and token masks (/metrics). Prints a JSON summary; exits 1 on any failure.

    python3 scripts/structured-output.py HOST:PORT [--prompts 50] [--speed 10]

Needs `openai` and `jsonschema` (scripts/test.sh installs both).
"""
import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
from openai import OpenAI

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
        "required": ["name", "age", "hobbies"]},
    "product": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["USD", "EUR", "GBP"]},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 15}, "maxItems": 3}},
        "required": ["name", "price", "currency", "in_stock"]},
    "event": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "format": "date"},
        "location": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
            "required": ["city", "country"]},
        "attendees": {"type": "integer", "minimum": 0}},
        "required": ["title", "date", "location"]},
    "review": {"type": "object", "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
        "reason": {"anyOf": [{"type": "string", "maxLength": 60}, {"type": "null"}]}},
        "required": ["label", "stars", "reason"]},
    "order": {"$defs": {"item": {"type": "object", "properties": {
        "product": {"type": "string", "maxLength": 30},
        "quantity": {"type": "integer", "minimum": 0}},
        "required": ["product", "quantity"]}},
        "type": "object", "properties": {
            "customer": {"type": "string", "maxLength": 30},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
            "paid": {"type": "boolean"}},
        "required": ["customer", "items", "paid"]},
}

MODEL = None  # the served model's id, read from /v1/models

SUBJECTS = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena",
            "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Ximena",
            "Yusuf", "Zoe", "Ada", "Boris", "Carmen", "Dmitri", "Elif", "Felix", "Greta", "Hugo", "Ines", "Jonas",
            "Keiko", "Luis", "Maya", "Nils", "Olga", "Pablo", "Rania", "Sami", "Tomas", "Ulla", "Viktor", "Wanda",
            "Yara", "Zane"]

ASK = {
    "person": "Describe a person called {s} as JSON: name, age, email and hobbies.",
    "product": "Invent a product that {s} sells, as JSON with its name, price, currency and whether it is in stock.",
    "event": "Describe {s}'s birthday party as JSON: title, date, location (city and country), attendees.",
    "review": "{s} wrote: 'The food was cold but the staff were kind.' Classify the review as JSON.",
    "order": "{s} ordered two books and a lamp. Write the order as JSON: customer, items (product, quantity), paid.",
}


def ask(client, name, schema, subject, stream, max_tokens):
    messages = [{"role": "user", "content": ASK[name].format(s=subject)}]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    kwargs = dict(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.7, seed=len(subject),
                  response_format=response_format)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def check(schema, text):
    """None when `text` is JSON valid against `schema` (formats checked), else why not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON ({e}): {text!r}"
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(value)]
    return f"invalid ({errors[0]}): {text!r}" if errors else None


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a time zone.",
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                    "required": ["timezone"]}}},
]


def call_tools(client, subject, choice, stream):
    """The tool calls of one reply (name, arguments text) and its text content."""
    kwargs = dict(model=MODEL, max_tokens=120, temperature=0.7, seed=len(subject), tools=TOOLS, tool_choice=choice,
                  parallel_tool_calls=False,
                  messages=[{"role": "user", "content": f"What is the weather where {subject} lives, in Lisbon?"}])
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0].message
        return [(c.function.name, c.function.arguments) for c in message.tool_calls or []], message.content
    calls, content = {}, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice_delta in chunk.choices:
            content += choice_delta.delta.content or ""
            for call in choice_delta.delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
    return [tuple(calls[i]) for i in sorted(calls)], content or None


def tools(client, prompts):
    """tool_choice required, named and none over `prompts` prompts, whole and streamed: the calls and their
    arguments checked against the functions' schemas, and the streamed deltas against the whole reply."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    named = {"type": "function", "function": {"name": "get_time"}}
    summary, failures = {}, []
    for label, choice in (("required", "required"), ("named", named), ("none", "none")):
        entry = summary.setdefault(label, {"replies": 0, "with_calls": 0, "valid_calls": 0, "streamed_equal": 0})
        for subject in SUBJECTS[:prompts]:
            whole, _ = call_tools(client, subject, choice, False)
            streamed, _ = call_tools(client, subject, choice, True)
            entry["replies"] += 1
            entry["with_calls"] += bool(whole)
            entry["streamed_equal"] += streamed == whole
            valid = bool(whole) and all(
                name in schemas and (label != "named" or name == "get_time") and check(schemas[name], args) is None
                for name, args in whole)
            entry["valid_calls"] += valid
            if label == "none" and whole:
                failures.append(f"tools none / {subject}: called {whole}")
            if label != "none" and not valid:
                failures.append(f"tools {label} / {subject}: {whole}")
            if streamed != whole:
                failures.append(f"tools {label} / {subject}: streamed {streamed} against whole {whole}")
    return summary, failures


def speed(client, schema, prompts, max_tokens):
    """Generated tokens/s of sequential requests, with and without the schema."""
    rates = {}
    for constrained in (False, True):
        tokens, start = 0, time.perf_counter()
        for subject in SUBJECTS[:prompts]:
            kwargs = dict(model=MODEL, max_tokens=max_tokens, temperature=0.7, seed=len(subject),
                          messages=[{"role": "user", "content": ASK["person"].format(s=subject)}])
            if constrained:
                kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
            tokens += client.chat.completions.create(**kwargs).usage.completion_tokens
        rates["schema" if constrained else "free"] = tokens / (time.perf_counter() - start)
    return rates


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--speed", type=int, default=10, help="prompts per mode in the speed comparison (0: none)")
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()
    client = OpenAI(base_url=f"http://{args.address}/v1", api_key="unused", max_retries=0, timeout=600)
    global MODEL
    MODEL = client.models.list().data[0].id
    summary, failures = {}, []
    jobs = [(name, subject, stream) for name in SCHEMAS for subject in SUBJECTS[:args.prompts] for stream in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda j: ask(client, j[0], SCHEMAS[j[0]], j[1], j[2], args.max_tokens), jobs))
    for (name, subject, stream), (text, finish) in zip(jobs, replies):
        problem = check(SCHEMAS[name], text)
        entry = summary.setdefault(name, {"replies": 0, "valid": 0, "stopped": 0})
        entry["replies"] += 1
        entry["valid"] += problem is None
        entry["stopped"] += finish == "stop"
        if problem:
            failures.append(f"{name} / {subject} / {'streamed' if stream else 'whole'}: {problem}")
    # Any JSON object: no schema bounds a string's length, so a reply may run to max_tokens (counted, not failed).
    objects = {"replies": 0, "valid": 0, "cut_at_max_tokens": 0}
    for subject in SUBJECTS[:max(1, args.prompts // 5)]:
        r = client.chat.completions.create(model=MODEL, max_tokens=args.max_tokens, temperature=0.7,
                                           messages=[{"role": "user", "content": ASK["person"].format(s=subject)}],
                                           response_format={"type": "json_object"})
        text, objects["replies"] = r.choices[0].message.content, objects["replies"] + 1
        if r.choices[0].finish_reason == "length":
            objects["cut_at_max_tokens"] += 1
            continue
        try:
            objects["valid"] += isinstance(json.loads(text), dict)
        except json.JSONDecodeError:
            failures.append(f"json_object / {subject}: {text!r}")
    summary["json_object"] = objects
    summary["tools"], tool_failures = tools(client, args.prompts)
    failures += tool_failures
    if args.speed:
        summary["tokens_per_s"] = speed(client, SCHEMAS["person"], args.speed, 120)
        summary["tokens_per_s"]["ratio"] = summary["tokens_per_s"]["schema"] / summary["tokens_per_s"]["free"]
    scrape = urllib.request.urlopen(f"http://{args.address}/metrics").read().decode()
    value = {line.split()[0]: float(line.split()[1]) for line in scrape.splitlines() if line.startswith("ember_grammar")}
    for what in ("grammars_compiled", "grammar_masks"):
        n, seconds = value[f"ember_{what}_total"], value[f"ember_{what}_seconds_total"]
        summary[what] = {"count": n, "mean_ms": 1e3 * seconds / max(n, 1)}
    print(json.dumps(summary, indent=1))
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
