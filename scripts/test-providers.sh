#!/usr/bin/env bash
# make test-providers (opt-in, SPEC R10/R11): installs the pinned real
# provider packages into .cache/ with npm and runs each provider's scenario
# suite offline against the loopback mock model. One section per provider;
# PROVIDERS="opencode ..." selects sections (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROOT=$PWD
PROVIDERS=${PROVIDERS:-opencode}
LOG_DIR=$ROOT/.cache/test-providers
mkdir -p "$LOG_DIR"

# npm_install DIR PACKAGE@VERSION: a private npm project in DIR.
npm_install() {
  mkdir -p "$1"
  (cd "$1" && { test -f package.json || echo '{"name":"tether-provider-cache","private":true}' > package.json; } &&
    npm install --no-audit --no-fund "$2")
}

# ---- OpenCode (SPEC R10) -------------------------------------------------
OPENCODE_VERSION=1.18.17
OPENCODE_CACHE=$ROOT/.cache/opencode
OPENCODE_BIN=$OPENCODE_CACHE/node_modules/opencode-linux-x64/bin/opencode
section_opencode() {
  if ! { test -x "$OPENCODE_BIN" && [ "$("$OPENCODE_BIN" --version)" = "$OPENCODE_VERSION" ]; }; then
    npm_install "$OPENCODE_CACHE" "opencode-ai@$OPENCODE_VERSION"
  fi
  test -x "$OPENCODE_BIN" || { echo "native opencode binary not found at $OPENCODE_BIN"; exit 1; }
  echo "test-providers: opencode $("$OPENCODE_BIN" --version) sha256 $(sha256sum "$OPENCODE_BIN" | cut -d' ' -f1)"
  local log=$LOG_DIR/opencode.log
  set -o pipefail
  TETHER_OPENCODE_BIN=$OPENCODE_BIN $GO test -count=1 -timeout 20m -v -run '^TestR10_ScenarioSuiteAgainstRealOpenCode$' \
    ./services/runnerd/internal/opencode/ 2>&1 | tee "$log" | grep -E '^(\s+real_test.go:[0-9]+: test-providers:|--- |ok |FAIL|panic)' \
    || { echo "test-providers: opencode failed; full log: $log"; tail -60 "$log"; exit 1; }
}

for p in $PROVIDERS; do
  "section_$p"
done
