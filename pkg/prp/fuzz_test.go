package prp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/proto"

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
			if c := CodeOf(err); c != CodeProtocolError && c != CodeFrameTooLarge {
				t.Fatalf("unexpected error code %q: %v", c, err)
			}
			return
		}
		out, err := Marshal(fr)
		if err != nil {
			if CodeOf(err) == CodeFrameTooLarge {
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

// TestWriteFuzzSeedCorpus rewrites testdata/fuzz when TETHER_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	if os.Getenv("TETHER_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set TETHER_WRITE_FUZZ_SEEDS=1 to regenerate the committed seed corpus")
	}
	for _, target := range []string{"FuzzUnmarshalFrame", "FuzzAccept"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range fuzzSeeds() {
			content := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b)))
			if err := os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
