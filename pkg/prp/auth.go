package prp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/coder/websocket"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Handshake timing and credential lifetimes.
const (
	// DefaultHandshakeTimeout bounds the gateway's half of the handshake
	// (Hello → Challenge → Proof) unless Authority.HandshakeTimeout is set.
	DefaultHandshakeTimeout = 5 * time.Second
	// ClientMessageTimeout bounds each handshake message runnerd waits for
	// (the gateway may do work between Accept and Welcome).
	ClientMessageTimeout = 10 * time.Second
	// LeaseTTL is the lifetime of a connection lease minted for a bootstrap.
	LeaseTTL = 24 * time.Hour
)

const (
	domainSecret      = "tether-runner-credential-secret-v1"
	domainAuthKey     = "tether-runner-auth-key-v1"
	domainServerProof = "tether-runner-server-proof-v1"
	domainClientProof = "tether-runner-client-proof-v1"

	secretLen    = sha256.Size
	maxClaimsLen = 2048
	maxIDLen     = 512
)

var b64 = base64.RawURLEncoding

// Claims are the public, HMAC-bound facts of a credential.
type Claims struct {
	Kind             string // bootstrap | lease
	RunnerInstanceID string
	SessionScope     string
	ExpiresAt        time.Time
	Nonce            string
}

type claimsWire struct {
	Kind             string `json:"kind"`
	RunnerInstanceID string `json:"runnerInstanceId"`
	SessionScope     string `json:"sessionScope"`
	ExpiresAtUnixMs  int64  `json:"expiresAtUnixMs"`
	Nonce            string `json:"nonce"`
}

// Credential is public claims plus a secret. The secret never crosses the
// wire except a freshly minted lease secret inside Welcome.
type Credential struct {
	Kind   string
	Claims string // base64url of the canonical claims JSON
	Secret []byte
}

// Encode renders the credential as one string: claims "." base64url(secret).
func (c Credential) Encode() string { return c.Claims + "." + b64.EncodeToString(c.Secret) }

// String never reveals the secret.
func (c Credential) String() string {
	return fmt.Sprintf("prp.Credential{kind=%s, secret=redacted}", c.Kind)
}

// GoString never reveals the secret.
func (c Credential) GoString() string { return c.String() }

// LogValue keeps the secret out of slog output.
func (c Credential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("kind", c.Kind), slog.String("secret", "redacted"))
}

// Decode returns the credential's claims.
func (c Credential) Decode() (Claims, error) {
	cl, _, err := DecodeClaims(c.Claims)
	return cl, err
}

// ParseCredential parses the Encode form.
func ParseCredential(s string) (Credential, error) {
	s = strings.TrimSpace(s)
	i := strings.LastIndexByte(s, '.')
	if i <= 0 || i == len(s)-1 {
		return Credential{}, errorf(failure.RunnerAuthFailed, "malformed credential")
	}
	cl, _, err := DecodeClaims(s[:i])
	if err != nil {
		return Credential{}, err
	}
	secret, err := b64.DecodeString(s[i+1:])
	if err != nil || len(secret) != secretLen {
		return Credential{}, errorf(failure.RunnerAuthFailed, "malformed credential secret")
	}
	return Credential{Kind: cl.Kind, Claims: s[:i], Secret: secret}, nil
}

// DecodeClaims decodes and validates the base64url claims form, returning the
// claims and the exact JSON bytes they were signed over.
func DecodeClaims(enc string) (Claims, []byte, error) {
	if enc == "" || len(enc) > maxClaimsLen {
		return Claims{}, nil, errorf(failure.RunnerAuthFailed, "malformed credential claims")
	}
	raw, err := b64.DecodeString(enc)
	if err != nil {
		return Claims{}, nil, errorf(failure.RunnerAuthFailed, "malformed credential claims encoding")
	}
	var w claimsWire
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Claims{}, nil, errorf(failure.RunnerAuthFailed, "malformed credential claims json")
	}
	if w.Kind != KindBootstrap && w.Kind != KindLease {
		return Claims{}, nil, errorf(failure.RunnerAuthFailed, "unknown credential kind")
	}
	if !validID(w.RunnerInstanceID) || !validID(w.SessionScope) || !validID(w.Nonce) || w.ExpiresAtUnixMs <= 0 {
		return Claims{}, nil, errorf(failure.RunnerAuthFailed, "incomplete credential claims")
	}
	return Claims{
		Kind:             w.Kind,
		RunnerInstanceID: w.RunnerInstanceID,
		SessionScope:     w.SessionScope,
		ExpiresAt:        time.UnixMilli(w.ExpiresAtUnixMs).UTC(),
		Nonce:            w.Nonce,
	}, raw, nil
}

func validID(s string) bool {
	if s == "" || len(s) > maxIDLen {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// frameInputs writes each input as an 8-byte big-endian length plus bytes.
func frameInputs(h hash.Hash, domain string, inputs ...[]byte) {
	h.Write([]byte(domain))
	h.Write([]byte{0})
	var n [8]byte
	for _, in := range inputs {
		binary.BigEndian.PutUint64(n[:], uint64(len(in)))
		h.Write(n[:])
		h.Write(in)
	}
}

// digestD is D(domain, inputs...) = SHA-256 over the framed inputs.
func digestD(domain string, inputs ...[]byte) []byte {
	h := sha256.New()
	frameInputs(h, domain, inputs...)
	return h.Sum(nil)
}

// hmacD is HMAC-SHA256 keyed by key over the same framing.
func hmacD(key []byte, domain string, inputs ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	frameInputs(h, domain, inputs...)
	return h.Sum(nil)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)
}

// signingBytes is the canonical JSON of the hello and challenge fields both
// proofs are bound to.
func signingBytes(h *prpv1.Hello, serverNonce string, selected uint32) ([]byte, error) {
	id := h.GetIdentity()
	return CanonicalJSON(map[string]any{
		"protocol":            h.GetProtocol(),
		"selectedVersion":     selected,
		"credentialKind":      h.GetCredentialKind(),
		"credentialClaims":    h.GetCredentialClaims(),
		"clientNonce":         h.GetClientNonce(),
		"serverNonce":         serverNonce,
		"runnerInstanceId":    id.GetRunnerInstanceId(),
		"environmentLeaseId":  id.GetEnvironmentLeaseId(),
		"normalizedSessionId": id.GetNormalizedSessionId(),
		"sessionScope":        id.GetSessionScope(),
		"runnerVersion":       id.GetRunnerVersion(),
	})
}

func proofs(secret, signing []byte) (server, client string) {
	authKey := digestD(domainAuthKey, secret)
	server = hex.EncodeToString(hmacD(authKey, domainServerProof, signing))
	client = hex.EncodeToString(hmacD(authKey, domainClientProof, signing, []byte(server)))
	return server, client
}

// Authority is the gateway side of runner authentication. Credential secrets
// are derived statelessly from the key, so a restarted gateway with the same
// key still recognises outstanding tickets and leases. Used bootstrap nonces
// are remembered in memory until their expiry.
type Authority struct {
	// HandshakeTimeout bounds Hello → Challenge → Proof on an accepted
	// connection (0: DefaultHandshakeTimeout). A runner that has not sent
	// its proof by then is sent a Goodbye failure.RunnerHandshakeTimeout and the
	// connection is closed with 1008 and that code (SPEC S5). Set it
	// before the first Accept.
	HandshakeTimeout time.Duration

	key []byte
	now func() time.Time

	mu   sync.Mutex
	used map[string]time.Time // bootstrap nonce -> expiry
}

// NewAuthority returns an Authority keyed by key; now defaults to time.Now.
func NewAuthority(key []byte, now func() time.Time) *Authority {
	if now == nil {
		now = time.Now
	}
	return &Authority{key: append([]byte(nil), key...), now: now, used: map[string]time.Time{}}
}

func (a *Authority) mint(kind, runnerInstanceID, sessionScope string, ttl time.Duration) (Credential, time.Time, error) {
	if !validID(runnerInstanceID) || !validID(sessionScope) {
		return Credential{}, time.Time{}, errorf(failure.RunnerAuthFailed, "credential needs a runner instance id and a session scope")
	}
	if ttl <= 0 {
		return Credential{}, time.Time{}, errorf(failure.RunnerAuthFailed, "credential ttl must be positive")
	}
	exp := a.now().Add(ttl)
	raw, err := CanonicalJSON(claimsWire{
		Kind:             kind,
		RunnerInstanceID: runnerInstanceID,
		SessionScope:     sessionScope,
		ExpiresAtUnixMs:  exp.UnixMilli(),
		Nonce:            randomHex(16),
	})
	if err != nil {
		return Credential{}, time.Time{}, err
	}
	return Credential{Kind: kind, Claims: b64.EncodeToString(raw), Secret: a.secretFor(raw)}, exp, nil
}

func (a *Authority) secretFor(rawClaims []byte) []byte {
	return hmacD(a.key, domainSecret, rawClaims)
}

// MintTicket mints a one-use bootstrap ticket.
func (a *Authority) MintTicket(runnerInstanceID, sessionScope string, ttl time.Duration) (Credential, error) {
	c, _, err := a.mint(KindBootstrap, runnerInstanceID, sessionScope, ttl)
	return c, err
}

// MintLease mints a reusable connection lease credential.
func (a *Authority) MintLease(runnerInstanceID, sessionScope string, ttl time.Duration) (Credential, error) {
	c, _, err := a.mint(KindLease, runnerInstanceID, sessionScope, ttl)
	return c, err
}

// Accepted is the outcome of a successful server handshake.
type Accepted struct {
	Hello        *prpv1.Hello
	Claims       Claims
	ConnectionID string
}

// Accept runs the gateway half of the handshake: Hello -> Challenge -> Proof,
// within HandshakeTimeout. On failure it sends a best-effort Goodbye carrying
// the code and returns a *Error; the caller closes the connection. When the
// timeout ends the handshake, Accept has already sent the Goodbye
// failure.RunnerHandshakeTimeout and closed the connection with 1008.
func (a *Authority) Accept(ctx context.Context, c *Conn) (*Accepted, error) {
	d := a.HandshakeTimeout
	if d <= 0 {
		d = DefaultHandshakeTimeout
	}
	// The reads carry no deadline of their own: a read whose context ends
	// closes the WebSocket at once, leaving no way to say why. The timer
	// says goodbye first, then closes, which ends the pending read.
	expired := make(chan struct{})
	timer := time.AfterFunc(d, func() {
		defer close(expired)
		a.goodbye(ctx, c, errorf(failure.RunnerHandshakeTimeout, "no handshake within %s", d))
		_ = c.Close(websocket.StatusPolicyViolation, failure.RunnerHandshakeTimeout)
	})
	acc, err := a.accept(ctx, c)
	if !timer.Stop() {
		<-expired
		return nil, errorf(failure.RunnerHandshakeTimeout, "no handshake within %s", d)
	}
	if err != nil {
		pe := asError(err)
		a.goodbye(ctx, c, pe)
		return nil, pe
	}
	return acc, nil
}

// goodbye sends a best-effort Goodbye carrying pe's code.
func (a *Authority) goodbye(ctx context.Context, c *Conn, pe *Error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer cancel()
	_ = c.Write(gctx, &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{Code: pe.Code, Message: pe.Message}}})
}

func asError(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return errorf(failure.RunnerProtocolError, "%v", err)
}

func readWithin(ctx context.Context, c *Conn, d time.Duration) (*prpv1.Frame, error) {
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return c.Read(rctx)
}

func (a *Authority) accept(ctx context.Context, c *Conn) (*Accepted, error) {
	f, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	h := f.GetHello()
	if h == nil {
		return nil, errorf(failure.RunnerProtocolError, "expected hello")
	}
	if h.GetProtocol() != Protocol {
		return nil, errorf(failure.RunnerProtocolError, "unknown protocol %q", h.GetProtocol())
	}
	if h.GetVersionMin() > Version || h.GetVersionMax() < Version {
		return nil, errorf(failure.RunnerProtocolError, "no common protocol version (runner %d..%d, gateway %d)", h.GetVersionMin(), h.GetVersionMax(), Version)
	}
	if n := len(h.GetClientNonce()); n < 16 || n > 128 {
		return nil, errorf(failure.RunnerProtocolError, "client nonce must be 16..128 characters")
	}
	claims, raw, err := DecodeClaims(h.GetCredentialClaims())
	if err != nil {
		return nil, err
	}
	if h.GetCredentialKind() != claims.Kind {
		return nil, errorf(failure.RunnerAuthFailed, "credential kind does not match its claims")
	}
	id := h.GetIdentity()
	if id.GetRunnerInstanceId() != claims.RunnerInstanceID || id.GetSessionScope() != claims.SessionScope {
		return nil, errorf(failure.RunnerAuthFailed, "runner identity does not match the credential")
	}
	if !a.now().Before(claims.ExpiresAt) {
		return nil, errorf(failure.RunnerCredentialExpired, "%s credential expired at %s", claims.Kind, claims.ExpiresAt.Format(time.RFC3339))
	}
	if claims.Kind == KindBootstrap && a.ticketUsed(claims.Nonce) {
		return nil, errorf(failure.RunnerTicketReplayed, "bootstrap ticket was already used")
	}

	serverNonce := randomHex(32)
	signing, err := signingBytes(h, serverNonce, Version)
	if err != nil {
		return nil, errorf(failure.RunnerProtocolError, "signing bytes: %v", err)
	}
	serverProof, clientProof := proofs(a.secretFor(raw), signing)
	if err := c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Challenge{Challenge: &prpv1.Challenge{
		ServerNonce: serverNonce, ServerProof: serverProof, SelectedVersion: Version,
	}}}); err != nil {
		return nil, err
	}

	f, err = c.Read(ctx)
	if err != nil {
		return nil, err
	}
	p := f.GetProof()
	if p == nil {
		return nil, errorf(failure.RunnerProtocolError, "expected proof")
	}
	if !hmac.Equal([]byte(p.GetClientProof()), []byte(clientProof)) {
		return nil, errorf(failure.RunnerAuthFailed, "client proof does not verify")
	}
	if claims.Kind == KindBootstrap && !a.consumeTicket(claims.Nonce, claims.ExpiresAt) {
		return nil, errorf(failure.RunnerTicketReplayed, "bootstrap ticket was already used")
	}
	return &Accepted{Hello: h, Claims: claims, ConnectionID: "conn_" + randomHex(12)}, nil
}

func (a *Authority) ticketUsed(nonce string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.used[nonce]
	return ok
}

// consumeTicket marks nonce used; false if it already was.
func (a *Authority) consumeTicket(nonce string, exp time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for n, e := range a.used {
		if !now.Before(e) {
			delete(a.used, n)
		}
	}
	if _, ok := a.used[nonce]; ok {
		return false
	}
	a.used[nonce] = exp
	return true
}

// Welcome completes the handshake. For a bootstrap credential it mints a
// connection lease (LeaseTTL) and sends its claims and secret.
func (a *Authority) Welcome(ctx context.Context, c *Conn, acc *Accepted, ackedSourceSeq uint64) error {
	w := &prpv1.Welcome{ConnectionId: acc.ConnectionID, AckedSourceSeq: ackedSourceSeq}
	if acc.Claims.Kind == KindBootstrap {
		lease, exp, err := a.mint(KindLease, acc.Claims.RunnerInstanceID, acc.Claims.SessionScope, LeaseTTL)
		if err != nil {
			return err
		}
		w.LeaseClaims = lease.Claims
		w.LeaseSecret = b64.EncodeToString(lease.Secret)
		w.LeaseExpiresAtUnixMs = exp.UnixMilli()
	} else {
		w.LeaseExpiresAtUnixMs = acc.Claims.ExpiresAt.UnixMilli()
	}
	return c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Welcome{Welcome: w}})
}

// ClientHandshake runs the runner half: it fills the credential and protocol
// fields into hello, sends it, verifies the gateway's proof, sends its own,
// and reads Welcome. It returns the welcome and the credential to use for
// reconnects (the new lease when one was issued, else cred). A Goodbye from
// the gateway is returned as a *Error with the gateway's code.
func ClientHandshake(ctx context.Context, c *Conn, cred Credential, hello *prpv1.Hello) (*prpv1.Welcome, Credential, error) {
	claims, _, err := DecodeClaims(cred.Claims)
	if err != nil {
		return nil, Credential{}, err
	}
	if len(cred.Secret) != secretLen {
		return nil, Credential{}, errorf(failure.RunnerAuthFailed, "credential secret has the wrong length")
	}
	if hello == nil {
		hello = &prpv1.Hello{}
	}
	hello.Protocol = Protocol
	hello.VersionMin = Version
	hello.VersionMax = Version
	hello.CredentialKind = claims.Kind
	hello.CredentialClaims = cred.Claims
	hello.ClientNonce = randomHex(24)
	if err := c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Hello{Hello: hello}}); err != nil {
		return nil, Credential{}, err
	}

	f, err := readWithin(ctx, c, ClientMessageTimeout)
	if err != nil {
		return nil, Credential{}, err
	}
	if g := f.GetGoodbye(); g != nil {
		return nil, Credential{}, goodbyeError(g)
	}
	ch := f.GetChallenge()
	if ch == nil {
		return nil, Credential{}, errorf(failure.RunnerProtocolError, "expected challenge")
	}
	if ch.GetSelectedVersion() != Version {
		return nil, Credential{}, errorf(failure.RunnerProtocolError, "gateway selected unsupported version %d", ch.GetSelectedVersion())
	}
	if n := len(ch.GetServerNonce()); n < 16 || n > 128 {
		return nil, Credential{}, errorf(failure.RunnerProtocolError, "server nonce must be 16..128 characters")
	}
	signing, err := signingBytes(hello, ch.GetServerNonce(), ch.GetSelectedVersion())
	if err != nil {
		return nil, Credential{}, errorf(failure.RunnerProtocolError, "signing bytes: %v", err)
	}
	serverProof, clientProof := proofs(cred.Secret, signing)
	if !hmac.Equal([]byte(ch.GetServerProof()), []byte(serverProof)) {
		return nil, Credential{}, errorf(failure.RunnerAuthFailed, "gateway proof does not verify")
	}
	if err := c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Proof{Proof: &prpv1.Proof{ClientProof: clientProof}}}); err != nil {
		return nil, Credential{}, err
	}

	f, err = readWithin(ctx, c, ClientMessageTimeout)
	if err != nil {
		return nil, Credential{}, err
	}
	if g := f.GetGoodbye(); g != nil {
		e := goodbyeError(g)
		e.PeerVerified = true
		return nil, Credential{}, e
	}
	w := f.GetWelcome()
	if w == nil {
		return nil, Credential{}, errorf(failure.RunnerProtocolError, "expected welcome")
	}
	next, err := credentialAfterWelcome(claims, cred, w)
	if err != nil {
		return nil, Credential{}, err
	}
	return w, next, nil
}

// credentialAfterWelcome returns the credential a runner keeps for
// reconnects after w: the lease it carries (which must belong to the same
// runner and scope), or cred itself when no lease was issued. A bootstrap
// credential must be answered with a lease.
func credentialAfterWelcome(claims Claims, cred Credential, w *prpv1.Welcome) (Credential, error) {
	if w.GetLeaseSecret() == "" && w.GetLeaseClaims() == "" {
		if claims.Kind == KindBootstrap {
			return Credential{}, errorf(failure.RunnerProtocolError, "welcome for a bootstrap credential carries no lease")
		}
		return cred, nil
	}
	lc, _, err := DecodeClaims(w.GetLeaseClaims())
	if err != nil {
		return Credential{}, err
	}
	secret, err := b64.DecodeString(w.GetLeaseSecret())
	if err != nil || len(secret) != secretLen {
		return Credential{}, errorf(failure.RunnerProtocolError, "malformed lease secret")
	}
	if lc.Kind != KindLease || lc.RunnerInstanceID != claims.RunnerInstanceID || lc.SessionScope != claims.SessionScope {
		return Credential{}, errorf(failure.RunnerProtocolError, "lease claims do not match the runner")
	}
	return Credential{Kind: KindLease, Claims: w.GetLeaseClaims(), Secret: secret}, nil
}

func goodbyeError(g *prpv1.Goodbye) *Error {
	code := g.GetCode()
	if code == "" {
		code = failure.RunnerProtocolError
	}
	return &Error{Code: code, Message: g.GetMessage()}
}
