#!/usr/bin/env bash
# Installs the real codex CLIs that the compatibility tests run against, once each, from the
# npm registry:
#   @openai/codex@0.171.0 into $HOME/.cache/exec-server/codex-0.171.0 (the default the
#     tests and the benchmark use; found through CODEX_BIN);
#   @openai/codex@0.169.0 into $HOME/.cache/exec-server/codex-0.169.0 (kept for older
#     clients: the end-to-end turn also runs with it; found through CODEX_BIN_0169).
# A version already installed in its prefix is left alone. CODEX_INSTALL_DIR, when set, is
# the parent directory of the codex-<version> prefixes instead of $HOME/.cache/exec-server.
set -euo pipefail

versions=(0.171.0 0.169.0)
root="${CODEX_INSTALL_DIR:-$HOME/.cache/exec-server}"

# Installs one exact version into its own prefix unless it is there already.
install_one() {
    local version=$1
    local prefix="$root/codex-$version"
    local bin="$prefix/node_modules/.bin/codex"

    if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "codex-cli $version" ]; then
        echo "codex $version is installed: $bin"
        return 0
    fi

    if ! command -v npm >/dev/null 2>&1; then
        echo "install-codex: npm is required to install @openai/codex@$version" >&2
        return 1
    fi

    mkdir -p "$prefix"
    # --prefix keeps the install out of any global location; the exact version, no caret.
    npm install --prefix "$prefix" --no-audit --no-fund --save-exact "@openai/codex@$version"
    local installed
    installed="$("$bin" --version)"
    if [ "$installed" != "codex-cli $version" ]; then
        echo "install-codex: expected codex-cli $version, got: $installed" >&2
        return 1
    fi
    echo "codex $version installed: $bin"
}

for version in "${versions[@]}"; do
    install_one "$version"
done
