#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver for the console's browser tests.
#
#   bash scripts/chromium.sh    # installs them with apt-get when missing (as root)
#
# Prints the browser's version last; fails when they are missing and cannot
# be installed (the browser tests must run in CI).
set -euo pipefail

log() { printf 'chromium.sh: %s\n' "$*" >&2; }

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "chromium or chromedriver not found: installing them with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq chromium chromium-driver >&2
  else
    log "error: chromium and chromedriver not found; install them (apt-get install chromium chromium-driver)"
    exit 1
  fi
fi
chromium --version
