#!/usr/bin/env bash
# `make e2e-clients` step one: the pinned agent clients from npm, each in its own prefix
# under DS4D_CLIENTS_DIR (default ~/.cache/ds4d-clients), plus the provider package
# opencode would otherwise fetch on first use. Needs the npm registry the first time only:
# a prefix already holding its pinned version is left as it is.
set -euo pipefail
DIR="${DS4D_CLIENTS_DIR:-$HOME/.cache/ds4d-clients}"
# The versions the suite is written against (the ones issue reports were made with).
CLIENTS=(
  "claude @anthropic-ai/claude-code 2.1.197"
  "codex @openai/codex 0.171.0"
  "opencode opencode-ai 1.18.33"
)
# opencode loads providers from npm at run time into its cache; the suite points its cache
# at DIR/opencode-cache and fills it here so runs stay offline.
OPENCODE_PROVIDER="@ai-sdk/openai-compatible"
command -v npm >/dev/null || { echo "e2e-clients: npm is needed (Node.js 18 or newer)" >&2; exit 1; }
mkdir -p "$DIR"
for entry in "${CLIENTS[@]}"; do
  read -r bin pkg version <<<"$entry"
  prefix="$DIR/$bin-$version"
  if [ -x "$prefix/node_modules/.bin/$bin" ]; then
    continue
  fi
  echo "e2e-clients: installing $pkg@$version into $prefix" >&2
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$pkg@$version" >&2
done
cache="$DIR/opencode-cache/opencode"
if [ ! -d "$cache/node_modules/$OPENCODE_PROVIDER" ]; then
  echo "e2e-clients: installing $OPENCODE_PROVIDER into $cache" >&2
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error "$OPENCODE_PROVIDER" >&2
fi
echo "$DIR"
