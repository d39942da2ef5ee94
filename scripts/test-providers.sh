#!/usr/bin/env bash
# make test-providers (opt-in, SPEC R10/R11): installs the pinned real
# provider packages into .cache/ with npm and runs each provider's scenario
# suite offline against the loopback mock model. One section per provider;
# PROVIDERS="opencode ..." selects sections (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROOT=$PWD
PROVIDERS=${PROVIDERS:-opencode acpx-codex acpx-claude}
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

# ---- ACPX agents: codex-acp and claude-agent-acp (SPEC R11) --------------
ACP_CODEX_VERSION=2.6.0
ACP_CLAUDE_VERSION=0.101.0
ACP_CACHE=$ROOT/.cache/acp
# acp_section AGENT PACKAGE VERSION: install the pinned agent package (node
# runs it) and run the ACP scenario suite's subtest for AGENT.
acp_section() {
  local agent=$1 pkg=$2 version=$3
  local dir=$ACP_CACHE/node_modules/$pkg
  if ! grep -qx "  \"version\": \"$version\"," "$dir/package.json" 2>/dev/null; then
    npm_install "$ACP_CACHE" "$pkg@$version"
  fi
  echo "test-providers: $pkg $version (node $(node --version)) sha256 $(sha256sum "$dir/dist/index.js" | cut -d' ' -f1) dist/index.js"
  local log=$LOG_DIR/acpx-$agent.log
  set -o pipefail
  TETHER_ACP_MODULES=$ACP_CACHE/node_modules $GO test -count=1 -timeout 20m -v -run "^TestR11_ScenarioSuiteAgainstRealACPAgents\$/^$agent\$" \
    ./services/runnerd/internal/scenario/ 2>&1 | tee "$log" | grep -E '^(test-providers:|\s+--- |--- |ok |FAIL|panic)' \
    || { echo "test-providers: acpx-$agent failed; full log: $log"; tail -60 "$log"; exit 1; }
}
section_acpx-codex() { acp_section codex @agentclientprotocol/codex-acp "$ACP_CODEX_VERSION"; }
section_acpx-claude() { acp_section claude @agentclientprotocol/claude-agent-acp "$ACP_CLAUDE_VERSION"; }

for p in $PROVIDERS; do
  "section_$p"
done
