package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/devpki"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// connectClient calls the executor's HTTP port (SPEC U3) the way a
// browser does: the Connect protocol's JSON form, over HTTP/1.1, with the
// caller's bearer token in the Authorization header.
type connectClient struct {
	t     *testing.T
	base  string // http://host:port
	token string
	hc    *http.Client
}

func newConnectClient(t *testing.T, addr, token string) *connectClient {
	return &connectClient{t: t, base: "http://" + addr, token: token, hc: &http.Client{Timeout: time.Minute}}
}

// connectError is a Connect error body.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"details"`
}

// reason is the ErrorInfo reason among the error's details ("" without).
func (e connectError) reason(t *testing.T) string {
	t.Helper()
	for _, d := range e.Details {
		if d.Type != "google.rpc.ErrorInfo" {
			continue
		}
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		require.NoError(t, err)
		var info errdetails.ErrorInfo
		require.NoError(t, proto.Unmarshal(b, &info))
		return info.GetReason()
	}
	return ""
}

func (c *connectClient) request(ctx context.Context, path, contentType string, body []byte) *http.Request {
	c.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", contentType)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req
}

// unary POSTs a JSON request to /<service>/<method> and returns the HTTP
// status and the response body (a message or a Connect error).
func (c *connectClient) unary(ctx context.Context, method string, req any) (int, []byte) {
	c.t.Helper()
	b, err := json.Marshal(req)
	require.NoError(c.t, err)
	resp, err := c.hc.Do(c.request(ctx, method, "application/json", b))
	require.NoError(c.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, out
}

// ok is unary that requires success and decodes the response.
func (c *connectClient) ok(ctx context.Context, method string, req any) map[string]any {
	c.t.Helper()
	code, body := c.unary(ctx, method, req)
	require.Equal(c.t, http.StatusOK, code, "%s: %s", method, body)
	var m map[string]any
	require.NoError(c.t, json.Unmarshal(body, &m))
	return m
}

// fails is unary that requires a Connect error and decodes it.
func (c *connectClient) fails(ctx context.Context, method string, req any) (int, connectError) {
	c.t.Helper()
	code, body := c.unary(ctx, method, req)
	require.NotEqual(c.t, http.StatusOK, code, "%s: %s", method, body)
	var e connectError
	require.NoError(c.t, json.Unmarshal(body, &e), "%s", body)
	return code, e
}

// watchEvent is one WatchRunResponse in its JSON form.
type watchEvent struct {
	Seq   string `json:"seq"`
	Event struct {
		EventType string `json:"eventType"`
		RunID     string `json:"runId"`
	} `json:"event"`
	Result json.RawMessage `json:"result"`
}

// connectStream is a server stream of the Connect protocol (JSON):
// enveloped messages, then an end-of-stream envelope.
type connectStream struct {
	t    *testing.T
	resp *http.Response
	r    *bufio.Reader
}

// watch opens WatchRun over Connect streaming (HTTP/1.1).
func (c *connectClient) watch(ctx context.Context, req any) *connectStream {
	c.t.Helper()
	b, err := json.Marshal(req)
	require.NoError(c.t, err)
	env := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(env[1:], uint32(len(b)))
	hreq := c.request(ctx, "/tether.executor.v1.ExecutorService/WatchRun", "application/connect+json", append(env, b...))
	resp, err := (&http.Client{}).Do(hreq) // no client timeout: the stream lasts
	require.NoError(c.t, err)
	require.Equal(c.t, http.StatusOK, resp.StatusCode)
	require.Equal(c.t, "HTTP/1.1", resp.Proto)
	require.Equal(c.t, "application/connect+json", resp.Header.Get("Content-Type"))
	c.t.Cleanup(func() { resp.Body.Close() })
	return &connectStream{t: c.t, resp: resp, r: bufio.NewReader(resp.Body)}
}

// next returns the stream's next message; nil and the end-of-stream error
// (nil when the stream ended cleanly) at its end.
func (s *connectStream) next() (*watchEvent, *connectError) {
	s.t.Helper()
	var head [5]byte
	_, err := io.ReadFull(s.r, head[:])
	require.NoError(s.t, err, "the stream ended without its end-of-stream message")
	body := make([]byte, binary.BigEndian.Uint32(head[1:]))
	_, err = io.ReadFull(s.r, body)
	require.NoError(s.t, err)
	if head[0]&0x02 != 0 {
		var end struct {
			Error *connectError `json:"error"`
		}
		require.NoError(s.t, json.Unmarshal(body, &end), "%s", body)
		if end.Error == nil {
			return nil, nil
		}
		return nil, end.Error
	}
	var ev watchEvent
	require.NoError(s.t, json.Unmarshal(body, &ev), "%s", body)
	return &ev, nil
}

func submitJSON(runID, session, prompt, company string) map[string]any {
	return map[string]any{"runId": runID, "input": map[string]any{
		"provider": map[string]any{"kind": "codex"},
		"binding":  map[string]any{"companyId": company, "agentId": "agent-1", "issueId": "ISS-1"},
		"task":     map[string]any{"prompt": prompt},
		"session": map[string]any{"normalizedSessionId": session, "driverKind": "codex_app_server",
			"lifecycle": map[string]any{"mode": "LIFECYCLE_MODE_WARM"}},
	}}
}

const (
	getRunPath = "/tether.executor.v1.ExecutorService/GetRun"
	submitPath = "/tether.executor.v1.ExecutorService/SubmitRun"
)

// TestU3_AUnaryCallInItsConnectJSONFormRunsTheGRPCHandler: on a stack
// with tenancy enforced, a run submitted and read as JSON over plain HTTP
// (curl's form in docs/api.md) is the run the gRPC API shows; an invalid
// request is refused by the same validation, a missing run by the same
// stable code, each with its ErrorInfo reason.
func TestU3_AUnaryCallInItsConnectJSONFormRunsTheGRPCHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{Auth: true, HTTP: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tok, err := h.st.Token("alice", time.Hour, "acme:writer")
	require.NoError(t, err)
	c := newConnectClient(t, h.st.HTTPAddr(), tok)

	sub := c.ok(ctx, submitPath, submitJSON("json-1", "json-s", "hello over http", "acme"))
	require.Equal(t, "json-1", sub["run"].(map[string]any)["runId"])
	for {
		got := c.ok(ctx, getRunPath, map[string]any{"runId": "json-1"})
		run := got["run"].(map[string]any)
		if run["state"] == "RUN_STATE_SUCCEEDED" {
			require.Equal(t, "acme", run["input"].(map[string]any)["binding"].(map[string]any)["companyId"])
			break
		}
		require.NotEqual(t, "RUN_STATE_FAILED", run["state"], "%v", run)
		select {
		case <-ctx.Done():
			t.Fatalf("json-1 did not succeed: %v", run)
		case <-time.After(100 * time.Millisecond):
		}
	}

	code, e := c.fails(ctx, getRunPath, map[string]any{"runId": "ghost"})
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "not_found", e.Code)
	require.True(t, strings.HasPrefix(e.Message, "run_not_found"), e.Message)
	require.Equal(t, "run_not_found", e.reason(t))

	code, e = c.fails(ctx, getRunPath, map[string]any{"runId": ""})
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "invalid_argument", e.Code, "protovalidate refused it: %s", e.Message)

	// The binary Connect form reaches the same handler.
	b, err := proto.Marshal(&executorv1.GetRunRequest{RunId: "json-1"})
	require.NoError(t, err)
	resp, err := c.hc.Do(c.request(ctx, getRunPath, "application/proto", b))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	var got executorv1.GetRunResponse
	require.NoError(t, proto.Unmarshal(b, &got))
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, got.GetRun().GetState())
}

// TestU3_WatchRunStreamsLiveOverConnectAndResumesFromASeq: WatchRun over
// the Connect protocol's server streaming on HTTP/1.1 (what the console's
// fetch reads) delivers a run's events while its turn is still held by
// the provider, then through its run.terminal and a clean end of stream;
// a second watch from a seq resumes after it.
func TestU3_WatchRunStreamsLiveOverConnectAndResumesFromASeq(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{Auth: true, HTTP: true, FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tok, err := h.st.Token("alice", time.Hour, "acme:reader", "acme:writer")
	require.NoError(t, err)
	c := newConnectClient(t, h.st.HTTPAddr(), tok)
	c.ok(ctx, submitPath, submitJSON("live-1", "live-s", stalledTurn, "acme"))

	s := c.watch(ctx, map[string]any{"runId": "live-1"})
	var seqs []string
	for {
		ev, end := s.next()
		require.Nil(t, end)
		require.NotNil(t, ev, "the stream ended before the held turn's first delta")
		seqs = append(seqs, ev.Seq)
		if ev.Event.EventType == "item.delta" {
			break // live: the provider holds the turn until released
		}
	}
	releaseStall(t, dir, "mid-stream")
	terminals := 0
	for {
		ev, end := s.next()
		if ev == nil {
			require.Nil(t, end, "clean end of stream")
			break
		}
		seqs = append(seqs, ev.Seq)
		if ev.Event.EventType == "run.terminal" {
			terminals++
			require.NotEmpty(t, ev.Result, "the final message carries the run's result")
		}
	}
	require.Equal(t, 1, terminals)
	for i, seq := range seqs {
		require.Equal(t, strconv.Itoa(i+1), seq, "contiguous run-local seqs")
	}

	// Resume after a dropped stream: from the last seq seen.
	mid := len(seqs) / 2
	s = c.watch(ctx, map[string]any{"runId": "live-1", "afterSeq": strconv.Itoa(mid)})
	var rest []string
	for {
		ev, end := s.next()
		if ev == nil {
			require.Nil(t, end)
			break
		}
		rest = append(rest, ev.Seq)
	}
	require.Equal(t, seqs[mid:], rest)

	// A watch of a run this caller cannot read ends in the stream's error.
	other, err := h.st.Token("mallory", time.Hour, "globex:reader")
	require.NoError(t, err)
	s = newConnectClient(t, h.st.HTTPAddr(), other).watch(ctx, map[string]any{"runId": "live-1"})
	ev, end := s.next()
	require.Nil(t, ev)
	require.NotNil(t, end)
	require.Equal(t, "not_found", end.Code)
	require.Equal(t, "run_not_found", end.reason(t))
}

// TestU3_OverHTTPTheSameTenancyRulesHold: a caller without a token, or
// with a forged one, is refused as on the gRPC port; globex's writer
// cannot read acme's run (it answers exactly as a missing run), lists
// none of acme's runs and cannot drain a gateway; an operator can.
func TestU3_OverHTTPTheSameTenancyRulesHold(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{Auth: true, HTTP: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	token := func(subject string, grants ...string) string {
		tok, err := h.st.Token(subject, time.Hour, grants...)
		require.NoError(t, err)
		return tok
	}
	acme := newConnectClient(t, h.st.HTTPAddr(), token("alice", "acme:writer"))
	globex := newConnectClient(t, h.st.HTTPAddr(), token("mallory", "globex:writer"))
	operator := newConnectClient(t, h.st.HTTPAddr(), token("olga", "operator"))
	acme.ok(ctx, submitPath, submitJSON("secret-run", "s", "acme's work", "acme"))

	for _, anon := range []*connectClient{newConnectClient(t, h.st.HTTPAddr(), ""), newConnectClient(t, h.st.HTTPAddr(), "not.a.jwt")} {
		code, e := anon.fails(ctx, getRunPath, map[string]any{"runId": "secret-run"})
		require.Equal(t, http.StatusUnauthorized, code)
		require.Equal(t, "unauthenticated", e.Code)
		require.Equal(t, "caller_unauthenticated", e.reason(t))
		code, _ = anon.fails(ctx, "/tether.executor.v1.ExecutorService/ListRuns", map[string]any{})
		require.Equal(t, http.StatusUnauthorized, code)
	}

	_, hidden := globex.fails(ctx, getRunPath, map[string]any{"runId": "secret-run"})
	_, missing := globex.fails(ctx, getRunPath, map[string]any{"runId": "no-such-run"})
	require.Equal(t, "not_found", hidden.Code)
	require.Equal(t, "run_not_found", hidden.reason(t))
	require.Equal(t, strings.ReplaceAll(missing.Message, "no-such-run", "secret-run"), hidden.Message, "exactly as a missing run")
	list := globex.ok(ctx, "/tether.executor.v1.ExecutorService/ListRuns", map[string]any{})
	require.Empty(t, list["runs"])
	require.Len(t, operator.ok(ctx, "/tether.executor.v1.ExecutorService/ListRuns", map[string]any{})["runs"], 1)

	drain := map[string]any{"gatewayId": stack.GatewayID, "reason": "maintenance"}
	code, e := globex.fails(ctx, "/tether.executor.v1.GatewayRegistry/DrainGateway", drain)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "caller_not_authorized", e.reason(t))
	code, e = operator.fails(ctx, "/tether.executor.v1.GatewayRegistry/DrainGateway", map[string]any{"gatewayId": "no-such-gateway", "reason": "x"})
	require.Equal(t, http.StatusNotFound, code, "an operator passes authorization: %s", e.Message)

	// Health and reflection are not served over HTTP.
	resp, err := acme.hc.Do(acme.request(ctx, "/grpc.health.v1.Health/Check", "application/json", []byte(`{}`)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// TestU3_OverHTTPSAClientCertificateAuthenticatesAsOnTheGRPCPort: with
// mTLS (SPEC S2) the HTTP port serves TLS with the executor's certificate;
// an operator's client certificate authenticates a call, and a caller
// without a certificate or token is refused.
func TestU3_OverHTTPSAClientCertificateAuthenticatesAsOnTheGRPCPort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{MTLS: true, HTTP: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	caPEM, err := os.ReadFile(filepath.Join(h.st.PKIDir(), devpki.CAFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	client := func(withCert bool) *connectClient {
		tc := &tls.Config{RootCAs: pool, ServerName: identity.Executor, MinVersion: tls.VersionTLS12}
		if withCert {
			cert, err := tls.LoadX509KeyPair(devpki.CertFile(h.st.PKIDir(), stack.Operator), devpki.KeyFile(h.st.PKIDir(), stack.Operator))
			require.NoError(t, err)
			tc.Certificates = []tls.Certificate{cert}
		}
		return &connectClient{t: t, base: "https://" + h.st.HTTPAddr(), hc: &http.Client{Timeout: time.Minute,
			Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}}
	}
	list := client(true).ok(ctx, "/tether.executor.v1.GatewayRegistry/ListGateways", map[string]any{})
	require.NotNil(t, list)
	code, e := client(false).fails(ctx, "/tether.executor.v1.GatewayRegistry/ListGateways", map[string]any{})
	require.Equal(t, http.StatusUnauthorized, code, e.Message)

	// Plain HTTP is not served on a TLS port.
	resp, err := http.Get("http://" + h.st.HTTPAddr() + getRunPath)
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}
}

// TestU3_AnHTTPPortOffLoopbackNeedsAuthentication: an executor whose gRPC
// port is on loopback but whose HTTP port is not refuses to start without
// an authentication configuration, before touching its database.
func TestU3_AnHTTPPortOffLoopbackNeedsAuthentication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "executor"), "-grpc-addr", "127.0.0.1:0", "-metrics-addr", "",
		"-http-addr", "0.0.0.0:0", "-insecure-allow-plaintext",
		"-database-url", "postgres://127.0.0.1:1/none", "-grant-key-file", filepath.Join(t.TempDir(), "none"))
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "requires caller identities", "%s", out)
	require.Contains(t, string(out), "-http-addr", "%s", out)
}
