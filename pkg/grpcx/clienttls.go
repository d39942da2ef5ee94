package grpcx

import (
	"crypto/tls"
	"errors"
	"flag"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/keyfile"
)

// ClientTLS is how a service dials one kind of peer (SPEC F6): the CA that
// verifies the peer's certificate, the client certificate it presents
// (mTLS), the server name the peer's certificate must carry, and whether
// plaintext is allowed off loopback.
type ClientTLS struct {
	// CAFile verifies the server (system roots when empty).
	CAFile string
	// CertFile and KeyFile are the client identity presented (mTLS).
	CertFile, KeyFile string
	// ServerName is the name the server's certificate is verified against
	// (default: the target's host).
	ServerName string
	// InsecurePlaintext allows plaintext to a non-loopback target when no
	// TLS setting is given. Loopback targets without TLS settings are
	// always plaintext.
	InsecurePlaintext bool
}

// RegisterClientTLSFlags registers -<prefix>-ca, -<prefix>-client-cert,
// -<prefix>-client-key, -<prefix>-server-name and
// -<prefix>-insecure-plaintext (each with its TETHER_* fallback) for
// dialing what (e.g. "the runner gateways").
func RegisterClientTLSFlags(fs *flag.FlagSet, prefix, what string) *ClientTLS {
	c := &ClientTLS{}
	envflag.StringVar(fs, &c.CAFile, prefix+"-ca", "", "", "CA bundle verifying the TLS certificates of "+what+" (system roots when empty; TLS is used off loopback)")
	envflag.StringVar(fs, &c.CertFile, prefix+"-client-cert", "", "", "client certificate presented to "+what+" (mTLS; default: -tls-cert)")
	envflag.StringVar(fs, &c.KeyFile, prefix+"-client-key", "", "", "key of -"+prefix+"-client-cert (default: -tls-key)")
	envflag.StringVar(fs, &c.ServerName, prefix+"-server-name", "", "", "TLS server name the certificates of "+what+" are verified against (default: the host of their address)")
	envflag.BoolVar(fs, &c.InsecurePlaintext, prefix+"-insecure-plaintext", "", false, "dial "+what+" in plaintext also off loopback (never needed on loopback; only for networks you trust)")
	return c
}

// WithDefaults fills the client identity from the service's own
// certificate (cfg's -tls-cert/-tls-key) and the CA from ca when unset.
func (c ClientTLS) WithDefaults(cfg *Config, ca string) ClientTLS {
	if c.CertFile == "" && c.KeyFile == "" && cfg != nil {
		c.CertFile, c.KeyFile = cfg.TLSCertFile, cfg.TLSKeyFile
	}
	if c.CAFile == "" {
		c.CAFile = ca
	}
	return c
}

// transport says how a target is dialed: with TLS, or in plaintext.
type transport int

const (
	transportTLS transport = iota
	transportPlaintext
)

// transportFor decides the transport: TLS whenever a CA or a server name
// is configured; otherwise plaintext on loopback, plaintext off loopback
// only when explicitly allowed, else TLS verified against the system roots.
// A client certificate alone does not force TLS on loopback (a service's
// own certificate is the default identity of every dial).
func (c ClientTLS) transportFor(target string) transport {
	switch {
	case c.CAFile != "" || c.ServerName != "":
		return transportTLS
	case isLoopbackTarget(target), c.InsecurePlaintext:
		return transportPlaintext
	}
	return transportTLS
}

// Dial connects to target as Dial does, with these settings.
func (c ClientTLS) Dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds, err := c.credentials(target)
	if err != nil {
		return nil, err
	}
	return Dial(target, "", append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
}

func (c ClientTLS) credentials(target string) (credentials.TransportCredentials, error) {
	if c.transportFor(target) == transportPlaintext {
		return insecure.NewCredentials(), nil
	}
	tc, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(tc), nil
}

func (c ClientTLS) tlsConfig() (*tls.Config, error) {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("grpcx: a client certificate needs its key (and a key its certificate)")
	}
	tc, err := ClientTLSConfig(c.CAFile, c.CertFile, c.KeyFile)
	if err != nil {
		return nil, err
	}
	tc.ServerName = c.ServerName
	return tc, nil
}

// LoadKeyPair loads a TLS certificate and its private key; the key is read
// as a key file (pkg/keyfile, SPEC S3: the file itself, not a symlink, a
// regular file owned by this process's user, mode 0600 or stricter), so a
// TLS key is held to the same rule as every other private key (SPEC T6).
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := keyfile.Read(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
