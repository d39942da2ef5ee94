package grant

import (
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/tether-run/tether/pkg/failure"
)

// FuzzVerifyGrant feeds untrusted grant strings (the "tether-grant" header
// as any caller can send it) through decoding and verification: nothing
// panics, every refusal is gateway_grant_invalid, and only a grant the
// fleet key signed for exactly this call is accepted.
func FuzzVerifyGrant(f *testing.F) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	good, err := NewSigner(fleetKey, time.Hour, at(now)).Sign(attachClaims())
	if err != nil {
		f.Fatal(err)
	}
	forged, err := NewSigner(otherKey, time.Hour, at(now)).Sign(attachClaims())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{good, forged, "", "tg1", "tg1...", "tg1.0123456789abcdef.e30.AAAA", good + ".", good[:len(good)-3]} {
		f.Add(s)
	}
	v, err := NewVerifier("gw-1", []ed25519.PublicKey{pubOf(fleetKey)}, at(now))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, derr := Decode(s)
		c, err := v.Verify(s, attachWant())
		if err != nil {
			if failure.CodeOf(err) == failure.GatewayGrantInvalid {
				return
			}
			t.Fatalf("refusal without %s: %v", failure.GatewayGrantInvalid, err)
		}
		if derr != nil || !ed25519.Verify(pubOf(fleetKey), message(tok.Payload), tok.Signature) {
			t.Fatalf("accepted a grant the fleet did not sign: %q", s)
		}
		if c.RunID != "run-1" || c.Attempt != 1 || c.Audience != "gw-1" {
			t.Fatalf("accepted other claims: %+v", c)
		}
	})
}
