package tenancy_test

import (
	"crypto/x509"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/tenancy"
)

// TestT1_GrantsAndCertificateURIsNameOnePrincipal: grants parse into
// roles per company (a writer also reads), certificate URI SANs carry the
// same grants, and malformed grants or URIs naming two principals are
// refused.
func TestT1_GrantsAndCertificateURIsNameOnePrincipal(t *testing.T) {
	t.Parallel()
	p, err := tenancy.ParseGrants("alice", tenancy.SourceToken, []string{"acme:writer", "globex:reader", "acme:reader"})
	require.NoError(t, err)
	require.True(t, p.Can("acme", tenancy.Reader))
	require.True(t, p.Can("acme", tenancy.Writer))
	require.True(t, p.Can("globex", tenancy.Reader))
	require.False(t, p.Can("globex", tenancy.Writer))
	require.False(t, p.Can("initech", tenancy.Reader))
	require.False(t, p.Can("acme", tenancy.Operator))
	require.Equal(t, []string{"acme", "globex"}, p.Companies())
	require.Equal(t, "token:alice", p.String())
	for _, bad := range [][]string{nil, {"acme"}, {"acme:admin"}, {":writer"}, {"ac/me:writer"}} {
		_, err := tenancy.ParseGrants("alice", tenancy.SourceToken, bad)
		require.Error(t, err, "%v", bad)
	}
	_, err = tenancy.ParseGrants("../x", tenancy.SourceToken, []string{"operator"})
	require.Error(t, err)

	uris, err := tenancy.GrantURIs("alice", []string{"acme:writer", "operator"})
	require.NoError(t, err)
	require.Equal(t, "spiffe://tether/operator/alice", uris[0].String())
	require.Equal(t, "spiffe://tether/company/acme/principal/alice/role/writer", uris[1].String())
	svc, _ := url.Parse("spiffe://tether/client")
	cp, err := tenancy.FromCertificate(&x509.Certificate{URIs: append([]*url.URL{svc}, uris...)})
	require.NoError(t, err)
	require.True(t, cp.Operator)
	require.Equal(t, tenancy.SourceCertificate, cp.Source)
	require.Equal(t, "alice", cp.Name)

	none, err := tenancy.FromCertificate(&x509.Certificate{URIs: []*url.URL{svc}})
	require.NoError(t, err)
	require.Nil(t, none, "a service certificate names no principal")
	two := []*url.URL{tenancy.CompanyURI("acme", "alice", tenancy.Writer), tenancy.CompanyURI("acme", "bob", tenancy.Reader)}
	_, err = tenancy.FromCertificate(&x509.Certificate{URIs: two})
	require.Error(t, err)
}

// TestT1_TokensVerifyOfflineAgainstTheJWKS: a minted token verifies
// against the JWKS; expiry, issuer, audience and the signing key are
// checked.
func TestT1_TokensVerifyOfflineAgainstTheJWKS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, tenancy.SigningKeyFile), filepath.Join(dir, tenancy.JWKSFile)
	require.NoError(t, tenancy.WriteSigningKey(key, jwks))
	m, err := tenancy.LoadMinter(key)
	require.NoError(t, err)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v, err := tenancy.LoadVerifier(jwks, "", "", func() time.Time { return now })
	require.NoError(t, err)
	tok, err := m.Mint("alice", []string{"acme:writer"}, time.Hour, now)
	require.NoError(t, err)
	p, err := v.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "token:alice", p.String())
	require.True(t, p.Can("acme", tenancy.Writer))

	// A remembered token still expires.
	clock := now
	cached, err := tenancy.LoadVerifier(jwks, "", "", func() time.Time { return clock })
	require.NoError(t, err)
	_, err = cached.Verify(tok)
	require.NoError(t, err)
	_, err = cached.Verify(tok)
	require.NoError(t, err)
	clock = now.Add(2 * time.Hour)
	_, err = cached.Verify(tok)
	require.ErrorContains(t, err, "expired")

	late, err := tenancy.LoadVerifier(jwks, "", "", func() time.Time { return now.Add(2 * time.Hour) })
	require.NoError(t, err)
	_, err = late.Verify(tok)
	require.ErrorContains(t, err, "expired")
	otherAud, err := tenancy.LoadVerifier(jwks, "", "another-service", func() time.Time { return now })
	require.NoError(t, err)
	_, err = otherAud.Verify(tok)
	require.Error(t, err)
	otherIss, err := tenancy.LoadVerifier(jwks, "someone-else", "", func() time.Time { return now })
	require.NoError(t, err)
	_, err = otherIss.Verify(tok)
	require.Error(t, err)

	// The signing key is no verification key.
	_, err = tenancy.LoadVerifier(key, "", "", nil)
	require.Error(t, err)
}
