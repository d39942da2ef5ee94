// Package grant is the executor fleet's signed authority for a runner
// gateway call (SPEC S1). Holding a network path to a gateway is not
// authority: each RunnerGateway call carries a grant, signed with the
// fleet's Ed25519 private key, that names the call (method), the run, the
// lease (owner, attempt), the session scope digest, the gateway it is meant
// for (audience) and an expiry. Gateways hold only public keys: they verify
// grants and can never mint one.
//
// A grant travels in the gRPC metadata header "tether-grant" as
//
//	tg1.<key id>.<base64url claims JSON>.<base64url signature>
//
// The signature covers a domain separator and the exact claims bytes, so
// verification never depends on re-encoding; the key id (a digest of the
// public key) only selects the key to try — several are accepted at once for
// rotation.
package grant

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// Header is the gRPC metadata key that carries a grant.
const Header = "tether-grant"

// MaxLen bounds an encoded grant; longer input is refused before decoding.
const MaxLen = 4096

// prefix names the token format version.
const prefix = "tg1"

// domain separates grant signatures from anything else the key could sign.
const domain = "tether-gateway-grant-v1\x00"

// Methods of tether.gateway.v1.RunnerGateway a grant can name.
const (
	MethodAttach        = "Attach"
	MethodSuspendRunner = "SuspendRunner"
	MethodCloseRunner   = "CloseRunner"
	MethodListRunners   = "ListRunners"
	MethodGetRunner     = "GetRunner"
)

// Claims is what a grant says.
type Claims struct {
	// Method is the RunnerGateway RPC (short name, e.g. "Attach").
	Method string `json:"method"`
	// RunID, Owner and Attempt are the run and its lease; Owner and
	// Attempt are checked only where the call carries a fencing token.
	RunID   string `json:"run_id,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Attempt uint64 `json:"attempt,omitempty"`
	// Scope is the session scope digest (scope.OfRun) the call acts on.
	Scope string `json:"scope,omitempty"`
	// Audience is the gateway id the grant is meant for.
	Audience string `json:"audience"`
	// ExpiresAt is the expiry in Unix milliseconds.
	ExpiresAt int64 `json:"expires_at"`
	// Turn is the digest of the one turn.start an Attach may relay
	// (TurnDigest); empty: none.
	Turn string `json:"turn,omitempty"`
	// ID names this grant (random, set by Sign): a gateway accepts each
	// grant once (Ledger, SPEC T4).
	ID string `json:"jti,omitempty"`
}

// KeyID names a public key: the first 8 bytes of its sha256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

func message(payload []byte) []byte {
	return append([]byte(domain), payload...)
}

// Signer mints grants with the fleet's private key.
type Signer struct {
	key   ed25519.PrivateKey
	kid   string
	ttl   time.Duration
	clock func() time.Time
}

// DefaultTTL is how long a grant is valid when the signer has no TTL. A
// grant is checked when a call starts (an Attach stream lives on).
const DefaultTTL = time.Minute

// NewSigner returns a Signer whose grants expire ttl (DefaultTTL when 0)
// after clock (time.Now when nil).
func NewSigner(key ed25519.PrivateKey, ttl time.Duration, clock func() time.Time) *Signer {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if clock == nil {
		clock = time.Now
	}
	return &Signer{key: key, kid: KeyID(key.Public().(ed25519.PublicKey)), ttl: ttl, clock: clock}
}

// Sign encodes and signs c, setting its expiry and, unless c names one, a
// fresh random id.
func (s *Signer) Sign(c Claims) (string, error) {
	c.ExpiresAt = s.clock().Add(s.ttl).UnixMilli()
	if c.ID == "" {
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return "", err
		}
		c.ID = base64.RawURLEncoding.EncodeToString(id)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	sig := ed25519.Sign(s.key, message(payload))
	enc := base64.RawURLEncoding
	return prefix + "." + s.kid + "." + enc.EncodeToString(payload) + "." + enc.EncodeToString(sig), nil
}

// Token is a decoded but not yet verified grant.
type Token struct {
	KeyID     string
	Payload   []byte
	Signature []byte
}

// Decode splits and base64-decodes an encoded grant without trusting it.
func Decode(s string) (*Token, error) {
	if len(s) > MaxLen {
		return nil, fmt.Errorf("grant longer than %d bytes", MaxLen)
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 || parts[0] != prefix {
		return nil, errors.New("not a " + prefix + " grant")
	}
	if len(parts[1]) != 16 {
		return nil, errors.New("malformed key id")
	}
	if _, err := hex.DecodeString(parts[1]); err != nil || strings.ToLower(parts[1]) != parts[1] {
		return nil, errors.New("malformed key id")
	}
	enc := base64.RawURLEncoding.Strict()
	payload, err := enc.DecodeString(parts[2])
	if err != nil || len(payload) == 0 {
		return nil, errors.New("malformed claims encoding")
	}
	sig, err := enc.DecodeString(parts[3])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, errors.New("malformed signature")
	}
	return &Token{KeyID: parts[1], Payload: payload, Signature: sig}, nil
}

// parseClaims decodes signed claims strictly: known fields only, one object.
func parseClaims(b []byte) (*Claims, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Claims
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if dec.More() {
		return nil, errors.New("claims: trailing data")
	}
	if c.Method == "" || c.Audience == "" || c.ExpiresAt <= 0 {
		return nil, errors.New("claims: method, audience and expiry are required")
	}
	return &c, nil
}

// Verifier checks grants for one gateway (its audience) against the fleet's
// public keys.
type Verifier struct {
	keys     map[string]ed25519.PublicKey
	audience string
	clock    func() time.Time
}

// NewVerifier returns a Verifier for the gateway named audience accepting
// grants signed by any of keys (more than one while keys rotate).
func NewVerifier(audience string, keys []ed25519.PublicKey, clock func() time.Time) (*Verifier, error) {
	if audience == "" {
		return nil, errors.New("grant: a gateway audience is required")
	}
	if len(keys) == 0 {
		return nil, errors.New("grant: at least one public key is required")
	}
	if clock == nil {
		clock = time.Now
	}
	v := &Verifier{keys: map[string]ed25519.PublicKey{}, audience: audience, clock: clock}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, errors.New("grant: not an Ed25519 public key")
		}
		v.keys[KeyID(k)] = k
	}
	return v, nil
}

// Audience is the gateway id grants must name.
func (v *Verifier) Audience() string { return v.audience }

// Want is what a call needs its grant to say.
type Want struct {
	Method string
	RunID  string
	Scope  string
	// Fenced calls (Attach) also compare the lease and the turn.
	Fenced  bool
	Owner   string
	Attempt uint64
	Turn    string
}

// Verify checks an encoded grant: its signature by one of the fleet's keys,
// its expiry, its audience, and that it names exactly the call described by
// want. Any failure is Unauthenticated gateway_grant_invalid; the message
// says why without echoing the grant.
func (v *Verifier) Verify(encoded string, want Want) (*Claims, error) {
	c, err := v.Authenticate(encoded, want.Method)
	if err != nil {
		return nil, err
	}
	if err := c.Match(want); err != nil {
		return nil, err
	}
	return c, nil
}

// Authenticate checks what can be checked before the call's request is
// read: the signature, the expiry, the audience and the method. The caller
// then matches the claims against the request (Match).
func (v *Verifier) Authenticate(encoded, method string) (*Claims, error) {
	if encoded == "" {
		return nil, invalid("no grant: every %s call needs a grant signed by the executor fleet (metadata %q)", method, Header)
	}
	tok, err := Decode(encoded)
	if err != nil {
		return nil, invalid("%v", err)
	}
	key, ok := v.keys[tok.KeyID]
	if !ok || !ed25519.Verify(key, message(tok.Payload), tok.Signature) {
		return nil, invalid("the grant is not signed by a key this gateway trusts")
	}
	c, err := parseClaims(tok.Payload)
	if err != nil {
		return nil, invalid("%v", err)
	}
	now := v.clock().UnixMilli()
	switch {
	case now >= c.ExpiresAt:
		return nil, invalid("the grant expired %d ms ago", now-c.ExpiresAt)
	case c.Audience != v.audience:
		return nil, invalid("the grant is for gateway %q, not %q", c.Audience, v.audience)
	case c.Method != method:
		return nil, invalid("the grant is for %s, not %s", c.Method, method)
	}
	return c, nil
}

// Match checks that authenticated claims name exactly the call want.
func (c *Claims) Match(want Want) error {
	switch {
	case c.Method != want.Method:
		return invalid("the grant is for %s, not %s", c.Method, want.Method)
	case c.RunID != want.RunID:
		return invalid("the grant is for run %q, not %q", c.RunID, want.RunID)
	case c.Scope != want.Scope:
		return invalid("the grant is for another session scope")
	case want.Fenced && c.Owner != want.Owner:
		return invalid("the grant is for owner %q, not %q", c.Owner, want.Owner)
	case want.Fenced && c.Attempt != want.Attempt:
		return invalid("the grant is for attempt %d, not %d", c.Attempt, want.Attempt)
	case want.Fenced && c.Turn != want.Turn:
		return invalid("the grant is for another turn")
	}
	return nil
}

// TurnDigest names one turn.start — its command id and text — as an Open
// and its grant carry it (SPEC T4): hex sha256 of id, a NUL, text.
func TurnDigest(commandID, text string) string {
	sum := sha256.Sum256([]byte(commandID + "\x00" + text))
	return hex.EncodeToString(sum[:])
}

func invalid(format string, args ...any) error {
	return failure.New(codes.Unauthenticated, failure.GatewayGrantInvalid, format, args...)
}
