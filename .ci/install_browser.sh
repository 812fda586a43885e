#!/usr/bin/env bash
# CI: Debian's Chromium for tests/test_widgets_browser.py (driven by the `playwright` Python
# package from the `test` extra; `playwright install` and its browser downloads are never used).
# Does nothing when /usr/bin/chromium is there already.  Refreshes the apt lists first, so stale
# lists in a cached image cannot make the install fail.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
    echo "install_browser: $CHROMIUM is there: $("$CHROMIUM" --version 2>/dev/null || echo '?')"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: no apt-get here; install Chromium at $CHROMIUM yourself" \
         "(or run the tests with MINILM_SKIP_BROWSER=1)" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_browser: need root (or sudo) to apt-get install chromium" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium
"$CHROMIUM" --version
