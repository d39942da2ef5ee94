package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// The console's tests (SPEC U4) drive Debian's Chromium, headless, with
// chromedp against a real stack. Without a Chromium they skip, unless
// TETHER_REQUIRE_BROWSER is set (make test sets it, and .ci/run installs
// the package), where they fail instead. Screenshots go to
// $TETHER_TEST_ARTIFACTS/<test>/ (make test: artifacts/console/ at the
// repository's root), else to artifacts/console/<test>/ beside this
// package.

// chromiumPath finds the browser: $TETHER_CHROMIUM, else Debian's
// chromium on PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TETHER_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("TETHER_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium found (apt-get install chromium, or set TETHER_CHROMIUM) and TETHER_REQUIRE_BROWSER is set")
	}
	t.Skip("no Chromium found (apt-get install chromium, or set TETHER_CHROMIUM); set TETHER_REQUIRE_BROWSER to fail instead")
	return ""
}

// page is one headless Chromium tab on the console of a stack.
type page struct {
	t         *testing.T
	ctx       context.Context // the tab's
	base      string          // http://host:port
	artifacts string
	shots     int
}

func newPage(t *testing.T, httpAddr string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	// The browser starts under the tab's own context (a step's timeout
	// must not end it).
	require.NoError(t, chromedp.Do(ctx))
	// The page's uncaught exceptions and console errors go to the test log.
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				t.Logf("page console: %s", m)
			}
		}
	}()
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
		<-logged
	})
	dir := os.Getenv("TETHER_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("artifacts", "console")
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return &page{t: t, ctx: ctx, base: "http://" + httpAddr, artifacts: dir}
}

// css selects the first element matching a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// run runs steps within d.
func (p *page) run(d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.screenshot("failed")
		p.t.Fatalf("browser: %v", err)
	}
}

// open shows the console at hash (e.g. "#/runs").
func (p *page) open(hash string) {
	p.t.Helper()
	p.run(time.Minute, chromedp.Navigate(p.base+"/console/"+hash), chromedp.WaitVisible(css("#view")))
}

// useToken enters a bearer token in the page's form (kept in the tab's
// sessionStorage).
func (p *page) useToken(token string) {
	p.t.Helper()
	// SetValue, not SendKeys: a JWT is hundreds of key events, each a
	// round trip to the browser (slow on a loaded machine).
	p.run(time.Minute, chromedp.SetValue(css("#token"), token), chromedp.Click(css("#token-save")))
}

// waitFor waits until the JavaScript expression is true.
func (p *page) waitFor(d time.Duration, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(d))); err != nil {
		p.screenshot("failed")
		p.t.Fatalf("browser: waiting for %s: %v", expr, err)
	}
}

func (p *page) text(sel string) string {
	p.t.Helper()
	return evalIn[string](p, fmt.Sprintf(`document.querySelector(%q).textContent`, sel))
}

// evalIn evaluates a JavaScript expression in the page.
func evalIn[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("browser: %s: %v", expr, err)
	}
	return v
}

// eval evaluates a JavaScript expression and decodes its JSON value into out.
func (p *page) eval(expr string, out any) {
	p.t.Helper()
	raw := evalIn[json.RawMessage](p, expr)
	if err := json.Unmarshal(raw, out); err != nil {
		p.t.Fatalf("browser: %s = %s: %v", expr, raw, err)
	}
}

// screenshot saves the viewport as NN-name.png among the test's artifacts.
func (p *page) screenshot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p.shots++
	path := filepath.Join(p.artifacts, fmt.Sprintf("%02d-%s.png", p.shots, name))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p.t.Logf("screenshot: %s", path)
}

// TestU4_TheConsoleStreamsARunLiveAndResumesAfterTheExecutorRestarts: a
// run submitted through the console's form shows its events while the
// provider still holds its turn; the executor is then killed and started
// again, the page says it reconnects, and it resumes from the last seq it
// showed: every seq 1..n once, through the run.terminal.
func TestU4_TheConsoleStreamsARunLiveAndResumesAfterTheExecutorRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{Auth: true, HTTP: true, FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tok, err := h.st.Token("alice", time.Hour, "acme:writer")
	require.NoError(t, err)
	p := newPage(t, h.st.HTTPAddr())
	p.open("#/runs")
	p.useToken(tok)
	p.waitFor(time.Minute, `document.getElementById('whoami').textContent.startsWith('alice')`)
	p.run(time.Minute,
		chromedp.SendKeys(css(`#submit-run input[name="runId"]`), "console-live"),
		chromedp.SendKeys(css(`#submit-run input[name="company"]`), "acme"),
		chromedp.SendKeys(css(`#submit-run input[name="session"]`), "console-s"),
		chromedp.SetValue(css(`#submit-run input[name="prompt"]`), stalledTurn),
		chromedp.Click(css(`#submit-run button[type="submit"]`)))
	// Live: the held turn's first delta is on the page before the turn ends.
	p.waitFor(time.Minute, `document.querySelector('#events li[data-type="item.delta"]') !== null`)
	require.Equal(t, "live", p.text("#stream-state"))
	p.screenshot("run-live")

	// A disconnect: the executor dies; the page keeps trying.
	h.st.Proc("executor").Kill()
	p.waitFor(time.Minute, `document.getElementById('stream-state').dataset.state === 'reconnecting'`)
	var before int
	p.eval(`document.querySelectorAll('#events li').length`, &before)
	p.screenshot("run-reconnecting")
	_, err = h.st.Start(ctx, "executor")
	require.NoError(t, err)
	releaseStall(t, dir, "mid-stream")
	p.waitFor(2*time.Minute, `document.getElementById('stream-state').dataset.state === 'ended'`)
	p.waitFor(time.Minute, `document.getElementById('run-state') !== null && document.getElementById('run-state').textContent === 'RUN_STATE_SUCCEEDED'`)
	p.screenshot("run-ended")

	var seqs []int
	p.eval(`Array.from(document.querySelectorAll('#events li')).map((li) => Number(li.dataset.seq))`, &seqs)
	require.Greater(t, len(seqs), before, "events arrived after the reconnect")
	for i, s := range seqs {
		require.Equal(t, i+1, s, "each seq once, in order: %v", seqs)
	}
	var terminals int
	p.eval(`document.querySelectorAll('#events li[data-type="run.terminal"]').length`, &terminals)
	require.Equal(t, 1, terminals)
	c := newConnectClient(t, h.st.HTTPAddr(), tok)
	run := c.ok(ctx, getRunPath, map[string]any{"runId": "console-live"})["run"].(map[string]any)
	require.Equal(t, fmt.Sprint(len(seqs)), run["eventCount"], "the page shows every stored event")
}

// TestU4_AnOperatorAnswersAnInteractionAndDrainsAGatewayInTheConsole: a
// run that asks the user (the fake's tether_ask_user) shows its pending
// interaction; the operator answers it in the page and the continuation
// run carries the answer; the session page shows the session's gateway;
// the operator drains that gateway in the page, and the registry shows the
// drain requested by the operator; the audit page lists both.
func TestU4_AnOperatorAnswersAnInteractionAndDrainsAGatewayInTheConsole(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, stack.Options{Auth: true, HTTP: true}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.st.SetExtraArgs("runnergw", h.st.RegistryArgs("executor")...)
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	writer, err := h.st.Token("alice", time.Hour, "acme:writer")
	require.NoError(t, err)
	operator, err := h.st.Token("olga", time.Hour, "operator")
	require.NoError(t, err)
	api := newConnectClient(t, h.st.HTTPAddr(), operator)
	newConnectClient(t, h.st.HTTPAddr(), writer).ok(ctx, submitPath, submitJSON("ask-1", "governed", "[wait] paint the fence", "acme"))

	for {
		list := api.ok(ctx, "/tether.executor.v1.ExecutorService/ListInteractions", map[string]any{"status": "pending"})
		if l, _ := list["interactions"].([]any); len(l) == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no pending interaction")
		case <-time.After(100 * time.Millisecond):
		}
	}

	p := newPage(t, h.st.HTTPAddr())
	p.open("#/interactions")
	p.useToken(operator)
	p.waitFor(time.Minute, `document.querySelector('form[data-interaction-id]') !== null`)
	p.screenshot("interaction-pending")
	var id string
	p.eval(`document.querySelector('form[data-interaction-id]').dataset.interactionId`, &id)
	p.run(time.Minute,
		chromedp.Click(css(`form[data-interaction-id] input[value="red"]`)),
		chromedp.Click(css(`form[data-interaction-id] button[type="submit"]`)))
	p.waitFor(time.Minute, `document.getElementById('notice').textContent.startsWith('answered')`)
	p.screenshot("interaction-answered")
	got := api.ok(ctx, "/tether.executor.v1.ExecutorService/GetInteraction", map[string]any{"interactionId": id})["interaction"].(map[string]any)
	require.Equal(t, "answered", got["status"])
	require.Contains(t, got["answeredBy"], "olga", "the audit names the principal")
	next := got["continuationRunId"].(string)
	for {
		run := api.ok(ctx, getRunPath, map[string]any{"runId": next, "companyId": "acme"})["run"].(map[string]any)
		if run["state"] == "RUN_STATE_SUCCEEDED" {
			require.Contains(t, run["result"].(map[string]any)["finalMessage"], "red", "the answer given in the page reached the provider")
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the continuation run did not succeed: %v", run)
		case <-time.After(100 * time.Millisecond):
		}
	}

	p.open("#/sessions")
	p.waitFor(time.Minute, `document.querySelector('#sessions-table tr[data-session="governed"]') !== null`)
	require.Equal(t, stack.GatewayID, p.text(`#sessions-table tr[data-session="governed"] td:nth-child(5)`))
	p.screenshot("sessions")

	p.open("#/gateways")
	row := fmt.Sprintf(`#gateways-table tr[data-gateway-id=%q]`, stack.GatewayID)
	p.waitFor(time.Minute, fmt.Sprintf(`document.querySelector(%q) !== null`, row+" button.drain"))
	p.screenshot("gateways")
	p.run(time.Minute,
		chromedp.SendKeys(css(row+` input[name="reason"]`), "host maintenance"),
		chromedp.Click(css(row+" button.drain")))
	p.waitFor(time.Minute, fmt.Sprintf(`document.querySelector(%q) !== null && document.querySelector(%q).textContent.startsWith('by ')`,
		row+" .drain-progress", row+" .drain-progress"))
	require.Equal(t, "draining", p.text(row+" .gateway-state"))
	p.screenshot("gateway-draining")
	gws := api.ok(ctx, "/tether.executor.v1.GatewayRegistry/ListGateways", map[string]any{})["gateways"].([]any)
	require.Len(t, gws, 1)
	gw := gws[0].(map[string]any)
	require.Equal(t, executorv1.GatewayState_GATEWAY_STATE_DRAINING.String(), gw["state"])
	require.Contains(t, gw["drain"].(map[string]any)["requestedBy"], "olga")
	require.Equal(t, "host maintenance", gw["drain"].(map[string]any)["reason"])

	p.open("#/audit")
	p.waitFor(time.Minute, `document.querySelectorAll('#audit-table tbody tr').length >= 2`)
	audit := p.text("#audit-table")
	require.Contains(t, audit, "answered by")
	require.Contains(t, audit, "requested by")
	p.screenshot("audit")
}

// TestU4_TheConsoleShowsACompanysUserOnlyItsCompany: the console has no
// rules of its own; with globex's token it lists only globex's runs, an
// acme run's page answers as a missing run, and the gateways page is
// refused; an operator pages through every company's runs and filters
// them; without a token the page asks for one.
func TestU4_TheConsoleShowsACompanysUserOnlyItsCompany(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{Auth: true, HTTP: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	token := func(subject string, grants ...string) string {
		tok, err := h.st.Token(subject, time.Hour, grants...)
		require.NoError(t, err)
		return tok
	}
	acme := newConnectClient(t, h.st.HTTPAddr(), token("alice", "acme:writer"))
	globex := newConnectClient(t, h.st.HTTPAddr(), token("gwen", "globex:writer"))
	for i := range 3 {
		acme.ok(ctx, submitPath, submitJSON(fmt.Sprintf("acme-%d", i), "a", "acme's work", "acme"))
	}
	globex.ok(ctx, submitPath, submitJSON("globex-0", "g", "globex's work", "globex"))

	p := newPage(t, h.st.HTTPAddr())
	p.open("#/runs")
	p.waitFor(time.Minute, `document.getElementById('notice').textContent.startsWith('caller_unauthenticated')`)
	p.screenshot("no-token")

	p.useToken(token("gary", "globex:reader"))
	p.waitFor(time.Minute, `document.querySelector('#runs-table tr[data-run-id]') !== null`)
	var ids []string
	p.eval(`Array.from(document.querySelectorAll('#runs-table tr[data-run-id]')).map((tr) => tr.dataset.runId)`, &ids)
	require.Equal(t, []string{"globex-0"}, ids)
	p.screenshot("globex-runs")
	p.open("#/run/acme-0")
	p.waitFor(time.Minute, `document.getElementById('notice').textContent.startsWith('run_not_found')`)
	p.open("#/gateways")
	p.waitFor(time.Minute, `document.getElementById('notice').textContent.startsWith('caller_not_authorized')`)
	p.screenshot("globex-gateways-refused")

	// An operator sees every company, two runs a page.
	p.run(time.Minute, chromedp.Click(css("#token-clear")))
	p.useToken(token("olga", "operator"))
	p.open("#/runs?size=2")
	seen := map[string]bool{}
	for page := 0; ; page++ {
		p.waitFor(time.Minute, `document.querySelectorAll('#runs-table tr[data-run-id]').length > 0`)
		p.eval(`Array.from(document.querySelectorAll('#runs-table tr[data-run-id]')).map((tr) => tr.dataset.runId)`, &ids)
		require.LessOrEqual(t, len(ids), 2)
		for _, id := range ids {
			require.False(t, seen[id], "%s on two pages", id)
			seen[id] = true
		}
		var more bool
		p.eval(`!document.getElementById('runs-next').disabled`, &more)
		if !more {
			break
		}
		require.Less(t, page, 3)
		var first string
		p.eval(`document.querySelector('#runs-table tr[data-run-id]').dataset.runId`, &first)
		p.run(time.Minute, chromedp.Click(css("#runs-next")))
		p.waitFor(time.Minute, fmt.Sprintf(`(() => { const r = document.querySelector('#runs-table tr[data-run-id]'); return r !== null && r.dataset.runId !== %q; })()`, first))
	}
	require.Equal(t, map[string]bool{"acme-0": true, "acme-1": true, "acme-2": true, "globex-0": true}, seen)
	p.screenshot("operator-runs-last-page")

	p.open("#/runs?company=globex")
	p.waitFor(time.Minute, `document.querySelectorAll('#runs-table tr[data-run-id]').length === 1`)
	p.eval(`Array.from(document.querySelectorAll('#runs-table tr[data-run-id]')).map((tr) => tr.dataset.runId)`, &ids)
	require.Equal(t, []string{"globex-0"}, ids)
}
