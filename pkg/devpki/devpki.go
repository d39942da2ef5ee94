// Package devpki writes a development PKI for tether's internal plane
// (SPEC S2): a CA, one certificate per identity role (pkg/identity) naming
// its identity URI, the executor fleet's grant key pair and its secrets key.
// It is for development and tests (tetherctl certs init, make up, the e2e
// harness); production issues certificates from its own CA with the same
// URI SANs. It lives apart from pkg/identity so that what only names roles
// (the gRPC bootstrap, authorization) does not link the grant signer.
package devpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/keyfile"
)

// Files InitDev writes into its directory (all mode 0600).
const (
	CAFile         = "ca.pem"
	CAKeyFile      = "ca.key"
	GrantKeyFile   = "grant.key"
	GrantPublicKey = "grant.pub"
	// SecretsKeyFile is the executors' -secrets-key-file (SPEC T3).
	SecretsKeyFile = "secrets.key"
)

// CertFile and KeyFile are the certificate and key of role in a directory
// InitDev wrote.
func CertFile(dir, role string) string { return filepath.Join(dir, role+".pem") }

// KeyFile is role's private key.
func KeyFile(dir, role string) string { return filepath.Join(dir, role+".key") }

// InitDev writes a development PKI into dir (created 0700, which must not
// hold one already): a CA, for every role a certificate (server and client
// use) naming the role's identity URI, the DNS names role and localhost,
// 127.0.0.1, ::1 and the extra hosts (DNS names or IPs), and the executor
// fleet's grant key pair and secrets key. It is for development and tests; production
// issues certificates from its own CA with the same URI SANs.
func InitDev(dir string, hosts []string, validity time.Duration) error {
	if validity <= 0 {
		validity = 365 * 24 * time.Hour
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(dir, CAFile)); err == nil {
		return fmt.Errorf("%s already holds a CA (%s); remove it or choose another directory", dir, CAFile)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "tether development CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile), caDER, caKey); err != nil {
		return err
	}
	for _, role := range identity.Roles {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: role},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			URIs:        []*url.URL{identity.URI(role)},
			DNSNames:    []string{role, "localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePair(CertFile(dir, role), KeyFile(dir, role), der, key); err != nil {
			return err
		}
	}
	if _, err = grant.WriteKeyPair(filepath.Join(dir, GrantKeyFile), filepath.Join(dir, GrantPublicKey)); err != nil {
		return err
	}
	_, err = keyfile.LoadOrCreate(filepath.Join(dir, SecretsKeyFile))
	return err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := keyfile.Create(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return err
	}
	return keyfile.Create(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
}

// IssueDev writes a client certificate and key named name (name.pem,
// name.key, mode 0600) into dir, signed by the development CA InitDev wrote
// there, carrying uris as its URI SANs (e.g. the tenancy URIs of
// pkg/tenancy) besides the client role's identity.
func IssueDev(dir, name string, uris []*url.URL, validity time.Duration) error {
	if validity <= 0 {
		validity = 365 * 24 * time.Hour
	}
	ca, caKey, err := loadDevCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        append([]*url.URL{identity.URI(identity.Client)}, uris...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(CertFile(dir, name), KeyFile(dir, name), der, key)
}

func loadDevCA(dir string) (*x509.Certificate, any, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := keyfile.Read(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s: no PEM CA certificate or key", dir)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}
