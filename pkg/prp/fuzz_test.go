package prp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

var fuzzNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fuzzClaims builds deterministic claims (the gateway derives the secret, so
// a hello needs only the public part).
func fuzzClaims(kind string, exp time.Time) string {
	raw, err := CanonicalJSON(claimsWire{Kind: kind, RunnerInstanceID: testRunner, SessionScope: testScope,
		ExpiresAtUnixMs: exp.UnixMilli(), Nonce: "00112233445566778899aabbccddeeff"})
	if err != nil {
		panic(err)
	}
	return b64.EncodeToString(raw)
}

func fuzzSeeds() map[string][]byte {
	hello := func(kind string, exp time.Time) []byte {
		h := testHello()
		h.Protocol, h.VersionMin, h.VersionMax = Protocol, Version, Version
		h.CredentialKind, h.CredentialClaims = kind, fuzzClaims(kind, exp)
		h.ClientNonce = "0123456789abcdef0123456789abcdef"
		h.SessionInput = &prpv1.ExecutionInput{Provider: &prpv1.Provider{Kind: "codex", Model: "gpt"}}
		b, err := Marshal(&prpv1.Frame{Kind: &prpv1.Frame_Hello{Hello: h}})
		if err != nil {
			panic(err)
		}
		return b
	}
	return map[string][]byte{
		"hello_bootstrap": hello(KindBootstrap, fuzzNow.Add(time.Hour)),
		"hello_lease":     hello(KindLease, fuzzNow.Add(time.Hour)),
		"hello_expired":   hello(KindBootstrap, fuzzNow.Add(-time.Hour)),
		"ack":             []byte(`{"ack":{"ackedSourceSeq":"12"}}`),
		"events":          []byte(`{"events":{"events":[{"schema":"tether.prp.event.v1","sourceSeq":"1","eventType":"item.delta","priority":2,"emittedAt":"2026-01-01T00:00:00Z","payload":{"delta":"hi","n":[1,2,{"a":null}]}}]}}`),
		"command":         []byte(`{"command":{"commandId":"c1","controllerSeq":"1","type":"turn.start","runId":"r","attempt":"2","payload":{"text":"go"}}}`),
		"welcome":         []byte(`{"welcome":{"connectionId":"conn_1","leaseClaims":"e30","leaseSecret":"AA","leaseExpiresAtUnixMs":"1","ackedSourceSeq":"3"}}`),
		"goodbye":         []byte(`{"goodbye":{"code":"runner_auth_failed","message":"no"}}`),
		"empty":           []byte(`{}`),
		"not_json":        []byte(`hello`),
	}
}

func FuzzUnmarshalFrame(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Unmarshal(b)
		if err != nil {
			if c := CodeOf(err); c != failure.RunnerProtocolError && c != failure.ProviderFrameTooLarge {
				t.Fatalf("unexpected error code %q: %v", c, err)
			}
			return
		}
		out, err := Marshal(fr)
		if err != nil {
			if CodeOf(err) == failure.ProviderFrameTooLarge {
				return
			}
			t.Fatalf("re-marshal: %v", err)
		}
		again, err := Unmarshal(out)
		if err != nil {
			t.Fatalf("decode of own encoding: %v", err)
		}
		if !proto.Equal(fr, again) {
			t.Fatalf("round trip changed the frame")
		}
	})
}

func FuzzAccept(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	a := NewAuthority([]byte("fuzz-key"), func() time.Time { return fuzzNow })
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > MaxFrameBytes {
			return
		}
		srv, cli := newPipe()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cli.t.write(ctx, b); err != nil {
			t.Fatal(err)
		}
		// The peer goes away right after its first frame: Accept must fail
		// promptly (never accept without a proof) and never panic.
		_ = cli.Close(websocket.StatusNormalClosure, "")
		acc, err := a.Accept(ctx, srv)
		if err == nil || acc != nil {
			t.Fatalf("accepted an unauthenticated peer: %+v", acc)
		}
		if CodeOf(err) == "" {
			t.Fatalf("error without a stable code: %v", err)
		}
	})
}

// handshakeSeeds are gateway answers (challenge, welcome) for the runner half.
func handshakeSeeds() map[string][2][]byte {
	welcome := []byte(`{"welcome":{"connectionId":"conn_1","leaseClaims":"` + fuzzClaims(KindLease, fuzzNow.Add(time.Hour)) +
		`","leaseSecret":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","leaseExpiresAtUnixMs":"1","ackedSourceSeq":"3"}}`)
	return map[string][2][]byte{
		"wrong_proof": {[]byte(`{"challenge":{"serverNonce":"0123456789abcdef0123456789abcdef","serverProof":"00ff","selectedVersion":1}}`), welcome},
		"bad_version": {[]byte(`{"challenge":{"serverNonce":"0123456789abcdef0123456789abcdef","serverProof":"00ff","selectedVersion":7}}`), welcome},
		"short_nonce": {[]byte(`{"challenge":{"serverNonce":"01","serverProof":"00ff","selectedVersion":1}}`), welcome},
		"goodbye":     {[]byte(`{"goodbye":{"code":"runner_ticket_replayed","message":"used"}}`), welcome},
		"welcome":     {welcome, welcome},
		"not_json":    {[]byte(`challenge`), []byte(`{}`)},
	}
}

// proofSeeds are runner answers to a challenge for the gateway half.
func proofSeeds() map[string][]byte {
	return map[string][]byte{
		"wrong_proof": []byte(`{"proof":{"clientProof":"` + strings.Repeat("ab", 32) + `"}}`),
		"empty_proof": []byte(`{"proof":{}}`),
		"hello_again": fuzzSeeds()["hello_bootstrap"],
		"goodbye":     []byte(`{"goodbye":{"code":"x"}}`),
		"not_json":    []byte(`proof`),
	}
}

// FuzzClientHandshake feeds arbitrary gateway answers (challenge, then
// welcome) to the runner half of the handshake. A forged challenge cannot
// verify (the runner's nonce is fresh every time), so the handshake must
// fail with a stable code, never panic and never yield a credential.
func FuzzClientHandshake(f *testing.F) {
	for _, s := range handshakeSeeds() {
		f.Add(s[0], s[1])
	}
	a := NewAuthority([]byte("fuzz-key"), func() time.Time { return fuzzNow })
	cred, err := a.MintTicket(testRunner, testScope, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, challenge, welcome []byte) {
		if len(challenge) > MaxFrameBytes || len(welcome) > MaxFrameBytes {
			return
		}
		srv, cli := newPipe()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, b := range [][]byte{challenge, welcome} {
			if err := srv.t.write(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		w, next, err := ClientHandshake(ctx, cli, cred, testHello())
		if err == nil || w != nil || next.Secret != nil {
			t.Fatalf("handshake verified a forged gateway: %v", w)
		}
		if CodeOf(err) == "" {
			t.Fatalf("error without a stable code: %v", err)
		}
	})
}

// FuzzAcceptProof sends a valid hello, then an arbitrary answer to the
// gateway's challenge: Accept must refuse it with a stable code.
func FuzzAcceptProof(f *testing.F) {
	for _, s := range proofSeeds() {
		f.Add(s)
	}
	a := NewAuthority([]byte("fuzz-key"), func() time.Time { return fuzzNow })
	cred, err := a.MintTicket(testRunner, testScope, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	h := testHello()
	h.Protocol, h.VersionMin, h.VersionMax = Protocol, Version, Version
	h.CredentialKind, h.CredentialClaims = KindBootstrap, cred.Claims
	h.ClientNonce = "0123456789abcdef0123456789abcdef"
	hello, err := Marshal(&prpv1.Frame{Kind: &prpv1.Frame_Hello{Hello: h}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, proof []byte) {
		if len(proof) > MaxFrameBytes {
			return
		}
		srv, cli := newPipe()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, b := range [][]byte{hello, proof} {
			if err := cli.t.write(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		acc, err := a.Accept(ctx, srv)
		if err == nil || acc != nil {
			t.Fatalf("accepted a runner without a valid proof")
		}
		if CodeOf(err) == "" {
			t.Fatalf("error without a stable code: %v", err)
		}
	})
}

// FuzzWelcomeLease decodes arbitrary Welcome frames into the credential a
// runner keeps: a lease is only ever taken for the same runner and scope,
// and a bootstrap credential is never kept after a welcome.
func FuzzWelcomeLease(f *testing.F) {
	for _, s := range handshakeSeeds() {
		f.Add(s[1])
	}
	f.Add(fuzzSeeds()["welcome"])
	a := NewAuthority([]byte("fuzz-key"), func() time.Time { return fuzzNow })
	cred, err := a.MintTicket(testRunner, testScope, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	claims, err := cred.Decode()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Unmarshal(b)
		if err != nil || fr.GetWelcome() == nil {
			return
		}
		next, err := credentialAfterWelcome(claims, cred, fr.GetWelcome())
		if err != nil {
			if CodeOf(err) == "" {
				t.Fatalf("error without a stable code: %v", err)
			}
			return
		}
		if next.Kind != KindLease || len(next.Secret) != secretLen {
			t.Fatalf("kept %s credential after a welcome", next.Kind)
		}
		lc, err := next.Decode()
		if err != nil || lc.Kind != KindLease || lc.RunnerInstanceID != testRunner || lc.SessionScope != testScope {
			t.Fatalf("took a lease for another runner: %+v %v", lc, err)
		}
	})
}

// TestWriteFuzzSeedCorpus rewrites testdata/fuzz when TETHER_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	if os.Getenv("TETHER_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set TETHER_WRITE_FUZZ_SEEDS=1 to regenerate the committed seed corpus")
	}
	corpus := map[string]map[string][][]byte{}
	for _, target := range []string{"FuzzUnmarshalFrame", "FuzzAccept"} {
		corpus[target] = map[string][][]byte{}
		for name, b := range fuzzSeeds() {
			corpus[target][name] = [][]byte{b}
		}
	}
	corpus["FuzzClientHandshake"] = map[string][][]byte{}
	corpus["FuzzWelcomeLease"] = map[string][][]byte{}
	for name, s := range handshakeSeeds() {
		corpus["FuzzClientHandshake"][name] = [][]byte{s[0], s[1]}
		corpus["FuzzWelcomeLease"][name] = [][]byte{s[1]}
	}
	corpus["FuzzAcceptProof"] = map[string][][]byte{}
	for name, b := range proofSeeds() {
		corpus["FuzzAcceptProof"][name] = [][]byte{b}
	}
	for target, seeds := range corpus {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, args := range seeds {
			content := "go test fuzz v1\n"
			for _, b := range args {
				content += fmt.Sprintf("[]byte(%s)\n", strconv.Quote(string(b)))
			}
			if err := os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
