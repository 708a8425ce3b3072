#!/usr/bin/env bash
# Make sure a headless-capable Chromium is on PATH for the HTML report's
# browser tests (tests/browser.py). Does nothing when chromium,
# chromium-browser or google-chrome is already there; otherwise installs
# Debian's `chromium` package (needs root, or sudo without a password).
set -euo pipefail

for name in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$name" >/dev/null 2>&1; then
    echo "ensure_chromium: found $(command -v "$name")"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_chromium: no chromium on PATH and no apt-get to install it;" \
    "install Chromium or Chrome by hand" >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
  else
    echo "ensure_chromium: installing chromium needs root (or sudo)" >&2
    exit 1
  fi
fi

echo "ensure_chromium: installing Debian's chromium package ..."
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
command -v chromium >/dev/null 2>&1 || {
  echo "ensure_chromium: apt-get finished but chromium is still not on PATH" >&2
  exit 1
}
echo "ensure_chromium: installed $(command -v chromium)"
