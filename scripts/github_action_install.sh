#!/usr/bin/env bash
# The install steps of the GitHub Action (action.yml at the repository root).
#
#   github_action_install.sh          the released wheel, when there is one
#   github_action_install.sh source   the build from the action's checkout
#
# The first form installs `adapterprobe==<the version of this checkout>` from
# the package index, wheels only (never an sdist: that would compile as well,
# and without cargo's cache), when the action is used at that version's
# release tag (`uses: <owner>/adapterprobe@v0.1.0`): only there is the release
# the same code as the checkout (a branch such as main carries the last
# release's version number on newer code; a commit SHA may be any code). It
# writes to $GITHUB_OUTPUT:
#   build      "true" when nothing was installed: the action then restores
#              cargo's cache and runs the second form
#   cargo-key  what the cache is keyed on: Cargo.lock and the Rust toolchain
#   target-dir the build's cargo target folder (cached with ~/.cargo)
# The second form runs `pip install` on the checkout with CARGO_TARGET_DIR set
# to that folder and says how long the build took.
#
# Inputs, from the environment (never spliced into the script):
#   AP_ACTION_PATH  the action's checkout
#   AP_ACTION_REF   the ref the workflow named the action at (github.action_ref)
#   CARGO_TARGET_DIR (source) the target folder, as the first form wrote it
set -uo pipefail
out="${GITHUB_OUTPUT:-/dev/null}"
checkout="${AP_ACTION_PATH:?the action checkout (AP_ACTION_PATH) is not set}"

# The version of the checkout: pyproject.toml's [project] version.
version=$(sed -n '/^\[project\]/,/^\[/{s/^version *= *"\([^"]*\)".*/\1/p}' "$checkout/pyproject.toml" | head -n1)
if [ -z "$version" ]; then
  echo "::error title=adapterprobe::no version in $checkout/pyproject.toml"
  exit 2
fi

if [ "${1:-}" = source ]; then
  echo "building adapterprobe $version from the action's checkout (the Rust core; cargo's"
  echo "cache restored: only what changed is compiled)"
  target="${CARGO_TARGET_DIR:-}"
  [ -n "$target" ] && mkdir -p "$target"
  start=$SECONDS
  python -m pip install "$checkout" || exit $?
  echo "adapterprobe $version built and installed in $((SECONDS - start)) s"
  exit 0
fi

# The release tag of this version, as the workflow may name it.
ref="${AP_ACTION_REF:-}"
build=true
if [ "$ref" = "v$version" ] || [ "$ref" = "$version" ]; then
  log=$(mktemp)
  if python -m pip install --only-binary adapterprobe "adapterprobe==$version" > "$log" 2>&1; then
    build=false
    echo "installed the released wheel of adapterprobe $version"
  else
    echo "no released wheel of adapterprobe $version installs here: building it from the action's checkout"
  fi
  echo "::group::pip install adapterprobe==$version"
  cat "$log"
  echo "::endgroup::"
  rm -f "$log"
else
  echo "the action is used at ${ref:-an unnamed ref}, not at the release tag v$version: building"
  echo "adapterprobe from the action's checkout (a released wheel is used at v$version)"
fi

# What the cache is keyed on: the locked crates and the toolchain that
# compiles them (a new rustc rebuilds everything, so it starts a new cache).
toolchain=$(rustc -V 2>/dev/null || echo "no rustc")
key=$({ cat "$checkout/Cargo.lock"; echo "$toolchain"; } | sha256sum | cut -c1-40)
{
  echo "build=$build"
  echo "cargo-key=$key"
  echo "target-dir=$HOME/.cache/adapterprobe-action/target"
} >> "$out"
