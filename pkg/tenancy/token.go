package tenancy

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tether-run/tether/pkg/keyfile"
)

// Token defaults: the issuer and audience a development token carries and
// a Verifier expects unless configured otherwise.
const (
	DefaultIssuer   = "tether"
	DefaultAudience = "tether-executor"
	// RolesClaim lists a token's grants ("acme:writer", "operator").
	RolesClaim = "tether_roles"
	// MaxTokenBytes bounds a bearer token a Verifier parses.
	MaxTokenBytes = 8 << 10
)

// algorithms a Verifier accepts (asymmetric only: the executor holds
// public keys, never a shared secret).
var algorithms = []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.EdDSA, jose.RS256, jose.PS256}

// leeway tolerates clock skew between the token's minter and the verifier.
const leeway = 30 * time.Second

type roleClaims struct {
	Roles []string `json:"tether_roles"`
}

// Verifier checks bearer tokens offline against a JWKS's public keys.
// A verified token is remembered until it expires (at most cacheSize of
// them), so a client sending the same token with every call pays for the
// signature check once.
type Verifier struct {
	keys     jose.JSONWebKeySet
	issuer   string
	audience string
	clock    func() time.Time

	mu    sync.Mutex
	cache map[string]verified
}

type verified struct {
	p      *Principal
	expiry time.Time
}

// cacheSize bounds the verified tokens a Verifier remembers.
const cacheSize = 4096

// LoadVerifier reads a JWKS file (public keys only) and verifies tokens
// issued by issuer for audience (the defaults when empty). clock is
// time.Now when nil.
func LoadVerifier(jwksFile, issuer, audience string, clock func() time.Time) (*Verifier, error) {
	b, err := os.ReadFile(jwksFile)
	if err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("tenancy: %s is not a JWKS: %w", jwksFile, err)
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("tenancy: %s holds no keys", jwksFile)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() || !k.Valid() {
			return nil, fmt.Errorf("tenancy: %s: key %q is not a valid public key (a JWKS for verification holds public keys only)", jwksFile, k.KeyID)
		}
	}
	if issuer == "" {
		issuer = DefaultIssuer
	}
	if audience == "" {
		audience = DefaultAudience
	}
	if clock == nil {
		clock = time.Now
	}
	return &Verifier{keys: set, issuer: issuer, audience: audience, clock: clock, cache: map[string]verified{}}, nil
}

// Verify checks a compact JWT's signature, issuer, audience, expiry (required)
// and not-before, and returns its principal.
func (v *Verifier) Verify(raw string) (*Principal, error) {
	if len(raw) > MaxTokenBytes {
		return nil, errors.New("token too long")
	}
	now := v.clock()
	v.mu.Lock()
	hit, ok := v.cache[raw]
	v.mu.Unlock()
	if ok && now.Before(hit.expiry) {
		return hit.p, nil
	}
	p, expiry, err := v.verify(raw, now)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.cache) >= cacheSize {
		for k, e := range v.cache {
			if !now.Before(e.expiry) || len(v.cache) >= cacheSize {
				delete(v.cache, k)
			}
		}
	}
	v.cache[raw] = verified{p: p, expiry: expiry}
	return p, nil
}

// verify checks a token's signature and claims at now.
func (v *Verifier) verify(raw string, now time.Time) (*Principal, time.Time, error) {
	tok, err := jwt.ParseSigned(raw, algorithms)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("token malformed: %w", err)
	}
	if len(tok.Headers) != 1 {
		return nil, time.Time{}, errors.New("token must carry one signature")
	}
	keys := v.keys.Keys
	if kid := tok.Headers[0].KeyID; kid != "" {
		keys = v.keys.Key(kid)
	}
	var (
		std   jwt.Claims
		roles roleClaims
		ok    bool
	)
	for _, k := range keys {
		if tok.Claims(k.Key, &std, &roles) == nil {
			ok = true
			break
		}
	}
	if !ok {
		return nil, time.Time{}, errors.New("token signature does not verify against the configured keys")
	}
	if std.Expiry == nil {
		return nil, time.Time{}, errors.New("token has no expiry")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: v.issuer, AnyAudience: jwt.Audience{v.audience}, Time: now}, leeway); err != nil {
		return nil, time.Time{}, fmt.Errorf("token rejected: %w", err)
	}
	p, err := ParseGrants(std.Subject, SourceToken, roles.Roles)
	return p, std.Expiry.Time().Add(leeway), err
}

// Files WriteSigningKey writes.
const (
	SigningKeyFile = "token-signing.key"
	JWKSFile       = "jwks.json"
)

// WriteSigningKey writes a new ES256 token signing key (PKCS#8 PEM, mode
// 0600) to privPath and the JWKS holding its public key to jwksPath.
func WriteSigningKey(privPath, jwksPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := keyfile.Create(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return err
	}
	pub := jose.JSONWebKey{Key: &key.PublicKey, Algorithm: string(jose.ES256), Use: "sig"}
	pub.KeyID, err = keyID(pub)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{pub}}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jwksPath, append(b, '\n'), 0o644) //nolint:gosec // a public key set: readable by whoever verifies tokens
}

func keyID(k jose.JSONWebKey) (string, error) {
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// Minter signs development tokens with a key WriteSigningKey wrote.
type Minter struct {
	signer jose.Signer
}

// LoadMinter reads the signing key at path (mode 0600, checked).
func LoadMinter(path string) (*Minter, error) {
	b, err := keyfile.Read(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("tenancy: %s holds no PEM key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tenancy: %s: %w", path, err)
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("tenancy: %s is not a P-256 key", path)
	}
	kid, err := keyID(jose.JSONWebKey{Key: &ec.PublicKey})
	if err != nil {
		return nil, err
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: ec},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return nil, err
	}
	return &Minter{signer: s}, nil
}

// Mint returns a token for subject with grants, valid for ttl from now.
func (m *Minter) Mint(subject string, grants []string, ttl time.Duration, now time.Time) (string, error) {
	if _, err := ParseGrants(subject, SourceToken, grants); err != nil {
		return "", err
	}
	std := jwt.Claims{
		Issuer: DefaultIssuer, Subject: subject, Audience: jwt.Audience{DefaultAudience},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)),
		Expiry: jwt.NewNumericDate(now.Add(ttl)),
	}
	return jwt.Signed(m.signer).Claims(std).Claims(roleClaims{Roles: grants}).Serialize()
}
