#!/usr/bin/env bash
# Installs the real codex CLI that the compatibility tests run against, once:
# @openai/codex@0.169.0 from the npm registry into $HOME/.cache/exec-server/codex-0.169.0.
# Does nothing when that exact version is already installed there. The tests find the
# binary through CODEX_BIN (default: <that directory>/node_modules/.bin/codex).
set -euo pipefail

version=0.169.0
prefix="${CODEX_INSTALL_DIR:-$HOME/.cache/exec-server/codex-$version}"
bin="$prefix/node_modules/.bin/codex"

if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "codex-cli $version" ]; then
    echo "codex $version is installed: $bin"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "install-codex: npm is required to install @openai/codex@$version" >&2
    exit 1
fi

mkdir -p "$prefix"
# --prefix keeps the install out of any global location; the exact version, no caret.
npm install --prefix "$prefix" --no-audit --no-fund --save-exact "@openai/codex@$version"
installed="$("$bin" --version)"
if [ "$installed" != "codex-cli $version" ]; then
    echo "install-codex: expected codex-cli $version, got: $installed" >&2
    exit 1
fi
echo "codex $version installed: $bin"
