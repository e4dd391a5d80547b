#!/usr/bin/env bash
# Packs what scripts/gpu-bench.sh needs on a GPU machine that has no Rust toolchain and no network into gpu/
# (git-ignored), for copying there beside the checkout:
#   gpu/ember.xz      the built `ember` binary, stripped and xz-compressed (~20 MB from ~170 MB)
#   gpu/debs/*.deb    the Vulkan loader and GL dispatch libraries (libvulkan1, libglvnd ...), unpacked there only
#                     when the system has no libvulkan.so.1
#   gpu/manifest.txt  the commit, the date and the binary's sha256
#
#   scripts/gpu-pack.sh [EMBER_BINARY]
#
# The binary is the argument, else $EMBER, else the debug build that `cargo build --workspace` / `cargo test
# --workspace` leave in the target directory ($CARGO_TARGET_DIR, else /var/tmp/ember-target from .cargo/config.toml).
# The debug profile builds every dependency and the kernels at opt-level 3, so that build is fit for timing.
set -euo pipefail
cd "$(dirname "$0")/.."

binary="${1:-${EMBER:-${CARGO_TARGET_DIR:-/var/tmp/ember-target}/debug/ember}}"
[ -x "$binary" ] || { echo "error: no ember binary at $binary (build it: cargo build --workspace)" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "error: the GPU machines are x86-64; this machine is $(uname -m)" >&2; exit 1; }
for tool in strip xz apt-get sha256sum; do
  command -v "$tool" >/dev/null || { echo "error: $tool is missing" >&2; exit 1; }
done

mkdir -p gpu/debs
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "stripping and compressing $binary"
strip -o "$tmp/ember" "$binary"
xz -T2 -6 -c "$tmp/ember" >"$tmp/ember.xz"
mv "$tmp/ember.xz" gpu/ember.xz

echo "downloading the Vulkan loader and GL dispatch packages into gpu/debs"
packages=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
rm -f gpu/debs/*.deb
# apt-get download writes into the current directory; as root it warns that the _apt user cannot write there.
(cd gpu/debs && apt-get download -q "${packages[@]}") 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
for p in "${packages[@]}"; do
  compgen -G "gpu/debs/${p}_*.deb" >/dev/null || { echo "error: $p was not downloaded" >&2; exit 1; }
done

commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit (with uncommitted changes)"
{
  echo "commit: $commit"
  echo "packed: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "binary: $binary, built $(date -u -r "$binary" '+%Y-%m-%d %H:%M UTC'), $(stat -c %s "$binary") bytes"
  echo "sha256 binary: $(sha256sum <"$binary" | cut -d' ' -f1)"
  echo "sha256 stripped: $(sha256sum <"$tmp/ember" | cut -d' ' -f1)"
  echo "sha256 ember.xz: $(sha256sum <gpu/ember.xz | cut -d' ' -f1)"
  for f in gpu/debs/*.deb; do echo "deb: $(basename "$f") $(sha256sum <"$f" | cut -d' ' -f1)"; done
} >gpu/manifest.txt
cat gpu/manifest.txt

bytes="$(du -sb gpu | cut -f1)"
echo "gpu/ holds $((bytes / 1048576)) MiB ($bytes bytes)"
# What travels to a GPU machine (the checkout and gpu/) is limited to 64 MiB; keep room for the checkout itself.
if [ "$bytes" -gt $((48 * 1048576)) ]; then
  echo "error: gpu/ is over 48 MiB" >&2
  exit 1
fi
