#!/usr/bin/env bash
# Mesa 26's lavapipe for one command: a software Vulkan driver with cooperative matrices (VK_KHR_cooperative_matrix)
# and f16, so Ember's cooperative-matrix WGSL kernels execute on a CPU. Debian 12's own lavapipe (Mesa 22.3) has
# neither. The driver comes from Debian 13's backports with Debian 13's C library, unpacked under $LAVAPIPE_DIR
# (default /var/tmp/ember-lavapipe-26, ~65 MB, once) and run through that library's own dynamic loader, so nothing is
# installed system-wide and a binary built here runs unchanged.
#
#   scripts/lavapipe-26.sh prepare             downloads and unpacks (from the Debian mirror apt already uses)
#   scripts/lavapipe-26.sh run BINARY [ARGS]   runs BINARY (a path) with Mesa 26's lavapipe as its only adapter
set -euo pipefail
dir=${LAVAPIPE_DIR:-/var/tmp/ember-lavapipe-26}
root=$dir/root
lib=$root/usr/lib/x86_64-linux-gnu
case "${1:-}" in
prepare)
  if [ -f "$dir/icd.json" ]; then exit 0; fi
  mirror=$(grep -rhoE "(^URIs:|^deb) +[a-z]+://[^ ]+/debian/?( |$)" /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | grep -oE "[a-z]+://[^ ]+/debian" | head -1 || true)
  if [ -z "$mirror" ]; then
    echo "lavapipe-26: no Debian mirror in /etc/apt/sources*" >&2
    exit 2
  fi
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$root"
  echo "deb $mirror trixie main" > "$dir/apt/sources.list"
  echo "deb $mirror trixie-backports main" >> "$dir/apt/sources.list"
  : > "$dir/apt/status"
  apt=(-o "Dir::Etc::sourcelist=$dir/apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
    -o "Dir::State::lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt" -o "Dir::Cache::archives=$dir/apt/archives"
    -o "Dir::State::status=$dir/apt/status" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${apt[@]}" -qq update
  apt-get "${apt[@]}" -qq -y --download-only --no-install-recommends \
    install mesa-vulkan-drivers/trixie-backports libvulkan1 >/dev/null
  for deb in "$dir"/apt/archives/*.deb; do dpkg-deb -x "$deb" "$root"; done
  # The manifest names the driver library without a path: the loader's library path finds it.
  cp "$root/usr/share/vulkan/icd.d/lvp_icd.json" "$dir/icd.json"
  ;;
run)
  shift
  [ -f "$dir/icd.json" ] || "$0" prepare >&2
  export VK_ICD_FILENAMES=$dir/icd.json XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:$root/lib/x86_64-linux-gnu" "$@"
  ;;
*)
  sed -n '2,9p' "$0"
  exit 2
  ;;
esac
