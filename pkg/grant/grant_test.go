package grant

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
)

// seedKey derives a deterministic key (fuzz seeds stay valid).
func seedKey(name string) ed25519.PrivateKey {
	s := sha256.Sum256([]byte(name))
	return ed25519.NewKeyFromSeed(s[:])
}

var (
	fleetKey = seedKey("fleet")
	nextKey  = seedKey("fleet-next")
	otherKey = seedKey("attacker")
	t0       = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
)

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

func attachClaims() Claims {
	return Claims{Method: MethodAttach, RunID: "run-1", Owner: "executor-a", Attempt: 1, Scope: "scope-1", Audience: "gw-1"}
}

func attachWant() Want {
	return Want{Method: MethodAttach, RunID: "run-1", Scope: "scope-1", Fenced: true, Owner: "executor-a", Attempt: 1}
}

func requireInvalid(t *testing.T, err error, contains string) {
	t.Helper()
	require.Error(t, err)
	require.EqualValues(t, failure.GatewayGrantInvalid, failure.CodeOf(err))
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.Contains(t, err.Error(), contains)
}

func TestS1_AGrantVerifiesOnlyForTheExactCallItWasSignedFor(t *testing.T) {
	v, err := NewVerifier("gw-1", []ed25519.PublicKey{pubOf(fleetKey)}, at(t0.Add(30*time.Second)))
	require.NoError(t, err)
	signed := func(k ed25519.PrivateKey, now time.Time, mod func(*Claims)) string {
		c := attachClaims()
		if mod != nil {
			mod(&c)
		}
		tok, err := NewSigner(k, time.Minute, at(now)).Sign(c)
		require.NoError(t, err)
		return tok
	}
	good := signed(fleetKey, t0, nil)
	c, err := v.Verify(good, attachWant())
	require.NoError(t, err)
	require.Equal(t, t0.Add(time.Minute).UnixMilli(), c.ExpiresAt)

	flip := func(tok string, part int) string {
		parts := strings.Split(tok, ".")
		b, err := base64.RawURLEncoding.DecodeString(parts[part])
		require.NoError(t, err)
		b[len(b)/2] ^= 1
		parts[part] = base64.RawURLEncoding.EncodeToString(b)
		return strings.Join(parts, ".")
	}
	for _, tc := range []struct {
		name, tok, why string
		want           func(*Want)
	}{
		{"missing", "", "no grant", nil},
		{"garbage", "hello", "not a tg1 grant", nil},
		{"too long", strings.Repeat("a", MaxLen+1), "longer than", nil},
		{"wrong key", signed(otherKey, t0, nil), "not signed by a key", nil},
		{"key id of the fleet, signature of another key", strings.Join(append(strings.Split(good, ".")[:3], strings.Split(signed(otherKey, t0, nil), ".")[3]), "."), "not signed by a key", nil},
		{"tampered claims", flip(good, 2), "not signed by a key", nil},
		{"tampered signature", flip(good, 3), "not signed by a key", nil},
		{"expired", signed(fleetKey, t0.Add(-time.Minute), nil), "expired", nil},
		{"other gateway", signed(fleetKey, t0, func(c *Claims) { c.Audience = "gw-2" }), "for gateway", nil},
		{"other method", good, "not SuspendRunner", func(w *Want) { w.Method = MethodSuspendRunner }},
		{"other run", good, "not \"run-2\"", func(w *Want) { w.RunID = "run-2" }},
		{"other scope", good, "another session scope", func(w *Want) { w.Scope = "scope-2" }},
		{"other owner", good, "not \"evil\"", func(w *Want) { w.Owner = "evil" }},
		{"other attempt", good, "not 18446744073709551615", func(w *Want) { w.Attempt = 1<<64 - 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := attachWant()
			if tc.want != nil {
				tc.want(&w)
			}
			_, err := v.Verify(tc.tok, w)
			requireInvalid(t, err, tc.why)
		})
	}
	// An unfenced call (CloseRunner) does not compare the lease.
	tok := signed(fleetKey, t0, func(c *Claims) { c.Method, c.Owner, c.Attempt = MethodCloseRunner, "", 0 })
	_, err = v.Verify(tok, Want{Method: MethodCloseRunner, RunID: "run-1", Scope: "scope-1"})
	require.NoError(t, err)
}

func TestS1_GatewaysAcceptASmallSetOfKeysForRotation(t *testing.T) {
	both, err := NewVerifier("gw-1", []ed25519.PublicKey{pubOf(fleetKey), pubOf(nextKey)}, at(t0))
	require.NoError(t, err)
	onlyNext, err := NewVerifier("gw-1", []ed25519.PublicKey{pubOf(nextKey)}, at(t0))
	require.NoError(t, err)
	for _, k := range []ed25519.PrivateKey{fleetKey, nextKey} {
		tok, err := NewSigner(k, 0, at(t0)).Sign(attachClaims())
		require.NoError(t, err)
		_, err = both.Verify(tok, attachWant())
		require.NoError(t, err)
	}
	old, err := NewSigner(fleetKey, 0, at(t0)).Sign(attachClaims())
	require.NoError(t, err)
	_, err = onlyNext.Verify(old, attachWant())
	requireInvalid(t, err, "not signed by a key")

	_, err = NewVerifier("", []ed25519.PublicKey{pubOf(fleetKey)}, nil)
	require.Error(t, err)
	_, err = NewVerifier("gw-1", nil, nil)
	require.Error(t, err)
}

func TestS1_KeyPairFilesArePrivateAndLoadBack(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "grant.key"), filepath.Join(dir, "grant.pub")
	p, err := WriteKeyPair(priv, pub)
	require.NoError(t, err)
	for _, f := range []string{priv, pub} {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
	_, err = WriteKeyPair(priv, pub)
	require.ErrorIs(t, err, os.ErrExist, "an existing key is never overwritten")

	k, err := LoadSigningKey(priv)
	require.NoError(t, err)
	require.Equal(t, p, pubOf(k))

	// Rotation: the next key's public key next to the current one.
	priv2, pub2 := filepath.Join(dir, "next.key"), filepath.Join(dir, "next.pub")
	p2, err := WriteKeyPair(priv2, pub2)
	require.NoError(t, err)
	keys, err := LoadPublicKeys(pub + ", " + pub2)
	require.NoError(t, err)
	require.Equal(t, []ed25519.PublicKey{p, p2}, keys)
	b1, _ := os.ReadFile(pub)
	b2, _ := os.ReadFile(pub2)
	bundle := filepath.Join(dir, "bundle.pub")
	require.NoError(t, os.WriteFile(bundle, append(b1, b2...), 0o600))
	keys, err = LoadPublicKeys(bundle)
	require.NoError(t, err)
	require.Len(t, keys, 2)

	_, err = LoadSigningKey(filepath.Join(dir, "missing.key"))
	require.ErrorContains(t, err, "tetherctl certs init")
	_, err = LoadPublicKeys("")
	require.Error(t, err)
	_, err = LoadPublicKeys(priv)
	require.ErrorContains(t, err, "no PEM PUBLIC KEY")
	_, err = LoadSigningKey(pub)
	require.ErrorContains(t, err, "no PEM PRIVATE KEY")
}
