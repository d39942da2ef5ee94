#!/usr/bin/env bash
# make test-providers (opt-in, SPEC R7, R10, R11, R12): installs the pinned
# real provider packages into .cache/ with npm and runs each provider's
# scenario suites offline against the loopback mock model:
#
#   opencode        the OpenCode driver suite (runnerd's driver in-process)
#   opencode-stack  OpenCode through executor → runnergw → runnerd (warm
#                   turns with history, steering unsupported, a command
#                   approval answered by the caller, cancel, kill -9 mid-turn
#                   and between turns, suspension and restore, usage across
#                   the kills and the restore, audit)
#   codex           the codex driver suite (make test-codex's)
#   codex-stack     codex through the whole stack, the same scenarios and a
#                   steer into the active turn
#   acpx-codex      the ACP suite against codex-acp
#   acpx-claude     the ACP suite against claude-agent-acp
#   acpx-codex-stack, acpx-claude-stack  each agent through the whole stack,
#                   the same scenarios as opencode-stack
#
# PROVIDERS="opencode codex-stack ..." selects sections (default: all).
# Every section runs even when an earlier one failed; each is reported
# (PASS/FAIL, seconds, its log) and the script exits non-zero when any
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROOT=$PWD
PROVIDERS=${PROVIDERS:-opencode opencode-stack codex codex-stack acpx-codex acpx-codex-stack acpx-claude acpx-claude-stack}
LOG_DIR=$ROOT/.cache/test-providers
mkdir -p "$LOG_DIR"

# npm_install DIR PACKAGE@VERSION: a private npm project in DIR.
npm_install() {
  mkdir -p "$1"
  (cd "$1" && { test -f package.json || echo '{"name":"tether-provider-cache","private":true}' > package.json; } &&
    npm install --no-audit --no-fund "$2")
}

# run_go LOG PATTERN ARGS...: go test with -v into LOG, showing the
# test-providers: lines and the verdicts; fails with the log's tail.
run_go() {
  local log=$1 pattern=$2
  shift 2
  "$GO" test -count=1 -timeout 30m -v "$@" 2>&1 | tee "$log" | grep -E "$pattern"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "test-providers: failed; full log: $log"
    tail -60 "$log"
  fi
  return "$rc"
}
DRIVER_LINES='^(\s+[a-z_]+_test.go:[0-9]+: test-(providers|codex):|test-(providers|codex):|\s*--- |ok |FAIL|panic)'

# The stack sections run the binaries of bin/ (make build) and the e2e
# package's PostgreSQL.
BUILT=
need_build() {
  if [ -z "$BUILT" ]; then
    make --no-print-directory build >/dev/null || return 1
    BUILT=1
  fi
}

# ---- OpenCode (SPEC R10) -------------------------------------------------
OPENCODE_VERSION=1.18.17
OPENCODE_CACHE=$ROOT/.cache/opencode
OPENCODE_BIN=$OPENCODE_CACHE/node_modules/opencode-linux-x64/bin/opencode
install_opencode() {
  if ! { test -x "$OPENCODE_BIN" && [ "$("$OPENCODE_BIN" --version)" = "$OPENCODE_VERSION" ]; }; then
    npm_install "$OPENCODE_CACHE" "opencode-ai@$OPENCODE_VERSION" || return 1
  fi
  test -x "$OPENCODE_BIN" || { echo "native opencode binary not found at $OPENCODE_BIN"; return 1; }
  echo "test-providers: opencode $("$OPENCODE_BIN" --version) sha256 $(sha256sum "$OPENCODE_BIN" | cut -d' ' -f1)"
}
section_opencode() {
  install_opencode || return 1
  TETHER_OPENCODE_BIN=$OPENCODE_BIN run_go "$LOG_DIR/opencode.log" "$DRIVER_LINES" \
    -run '^TestR10_ScenarioSuiteAgainstRealOpenCode$' ./services/runnerd/internal/opencode/
}
section_opencode-stack() {
  install_opencode && need_build || return 1
  TETHER_TEST_BIN=$ROOT/bin TETHER_OPENCODE_BIN=$OPENCODE_BIN run_go "$LOG_DIR/opencode-stack.log" "$DRIVER_LINES" \
    -run '^TestR10_Stack_RealProviderScenarios$/^opencode$' \
    ./services/executor/internal/e2e/
}

# ---- codex (SPEC R2, R7) -------------------------------------------------
CODEX_VERSION=0.169.0
CODEX_CACHE=$ROOT/.cache/codex
CODEX_BIN=$CODEX_CACHE/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
install_codex() {
  if ! { test -x "$CODEX_BIN" && "$CODEX_BIN" --version | grep -qx "codex-cli $CODEX_VERSION"; }; then
    npm_install "$CODEX_CACHE" "@openai/codex@$CODEX_VERSION" || return 1
  fi
  test -x "$CODEX_BIN" || { echo "native codex binary not found at $CODEX_BIN"; return 1; }
  echo "test-providers: $("$CODEX_BIN" --version) sha256 $(sha256sum "$CODEX_BIN" | cut -d' ' -f1)"
}
# codex refuses to create its sandbox helper (the codex-linux-sandbox alias
# bwrap runs) when CODEX_HOME is under the temporary directory ("/tmp"):
# sandboxed commands then fail. The codex suites' directories are under
# .cache/test-providers/tmp instead.
CODEX_TMP=$LOG_DIR/tmp
section_codex() {
  install_codex || return 1
  mkdir -p "$CODEX_TMP"
  TMPDIR=$CODEX_TMP TETHER_CODEX_BIN=$CODEX_BIN run_go "$LOG_DIR/codex.log" "$DRIVER_LINES" \
    -run '^TestR2_ScenarioSuiteAgainstRealCodex$' ./services/runnerd/internal/testing/scenario/
}
section_codex-stack() {
  install_codex && need_build || return 1
  mkdir -p "$CODEX_TMP"
  TMPDIR=$CODEX_TMP TETHER_TEST_BIN=$ROOT/bin TETHER_CODEX_BIN=$CODEX_BIN run_go "$LOG_DIR/codex-stack.log" "$DRIVER_LINES" \
    -run '^TestR10_Stack_RealProviderScenarios$/^codex$' ./services/executor/internal/e2e/
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
    npm_install "$ACP_CACHE" "$pkg@$version" || return 1
  fi
  echo "test-providers: $pkg $version (node $(node --version)) sha256 $(sha256sum "$dir/dist/index.js" | cut -d' ' -f1) dist/index.js"
  TETHER_ACP_MODULES=$ACP_CACHE/node_modules run_go "$LOG_DIR/acpx-$agent.log" "$DRIVER_LINES" \
    -run "^TestR11_ScenarioSuiteAgainstRealACPAgents\$/^$agent\$" ./services/runnerd/internal/testing/scenario/
}
section_acpx-codex() { acp_section codex @agentclientprotocol/codex-acp "$ACP_CODEX_VERSION"; }
section_acpx-claude() { acp_section claude @agentclientprotocol/claude-agent-acp "$ACP_CLAUDE_VERSION"; }
# acp_stack_section AGENT PACKAGE VERSION: the agent through the whole stack.
acp_stack_section() {
  local agent=$1 pkg=$2 version=$3
  if ! grep -qx "  \"version\": \"$version\"," "$ACP_CACHE/node_modules/$pkg/package.json" 2>/dev/null; then
    npm_install "$ACP_CACHE" "$pkg@$version" || return 1
  fi
  need_build || return 1
  TETHER_TEST_BIN=$ROOT/bin TETHER_ACP_MODULES=$ACP_CACHE/node_modules run_go "$LOG_DIR/acpx-$agent-stack.log" "$DRIVER_LINES" \
    -run "^TestR10_Stack_RealProviderScenarios\$/^acpx-$agent\$" ./services/executor/internal/e2e/
}
section_acpx-codex-stack() { acp_stack_section codex @agentclientprotocol/codex-acp "$ACP_CODEX_VERSION"; }
section_acpx-claude-stack() { acp_stack_section claude @agentclientprotocol/claude-agent-acp "$ACP_CLAUDE_VERSION"; }

failed=0
summary=()
for p in $PROVIDERS; do
  if ! declare -F "section_$p" >/dev/null; then
    echo "test-providers: unknown section $p"
    summary+=("FAIL $p (unknown section)")
    failed=1
    continue
  fi
  echo "==== test-providers: $p"
  start=$SECONDS
  if "section_$p"; then
    summary+=("PASS $p ($((SECONDS - start)) s)")
  else
    summary+=("FAIL $p ($((SECONDS - start)) s; log in $LOG_DIR)")
    failed=1
  fi
done
echo "==== test-providers summary"
printf '%s\n' "${summary[@]}"
exit $failed
