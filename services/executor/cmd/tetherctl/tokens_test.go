package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/devpki"
	"github.com/tether-run/tether/pkg/tenancy"
)

// TestT1_TetherctlMakesDevelopmentTokensAndCertificates: tokens init
// writes a signing key and the JWKS the executor verifies against; tokens
// mint prints a token naming the principal and its grants; certs issue
// writes a certificate whose URI SANs name the principal; certs init
// writes the development operator's certificate.
func TestT1_TetherctlMakesDevelopmentTokensAndCertificates(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, tokensCmd([]string{"init", dir}, &out))
	out.Reset()
	require.NoError(t, tokensCmd([]string{"mint", "-key", filepath.Join(dir, tenancy.SigningKeyFile),
		"-subject", "alice", "-role", "acme:writer", "-role", "globex:reader"}, &out))
	v, err := tenancy.LoadVerifier(filepath.Join(dir, tenancy.JWKSFile), "", "", nil)
	require.NoError(t, err)
	p, err := v.Verify(strings.TrimSpace(out.String()))
	require.NoError(t, err)
	require.Equal(t, "token:alice", p.String())
	require.True(t, p.Can("acme", tenancy.Writer))
	require.False(t, p.Can("globex", tenancy.Writer))
	require.Error(t, tokensCmd([]string{"mint", "-key", filepath.Join(dir, tenancy.SigningKeyFile), "-subject", "x", "-role", "acme:admin"}, &out))

	pki := filepath.Join(dir, "pki")
	require.NoError(t, certs([]string{"init", pki}))
	require.NoError(t, certs([]string{"issue", pki, "-name", "bob", "-role", "acme:reader"}))
	for name, want := range map[string]string{"bob": "cert:bob", tenancy.OperatorName: "cert:" + tenancy.OperatorName} {
		b, err := os.ReadFile(devpki.CertFile(pki, name))
		require.NoError(t, err)
		block, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		p, err := tenancy.FromCertificate(cert)
		require.NoError(t, err)
		require.Equal(t, want, p.String())
	}
}
