package grant

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/tether-run/tether/pkg/keyfile"
)

// Key files are PEM: the private key as PKCS #8 ("PRIVATE KEY", what
// `openssl genpkey -algorithm ed25519` writes), public keys as PKIX
// ("PUBLIC KEY"); a public key file may hold several keys.

// WriteKeyPair creates a new Ed25519 key pair: the private key at privPath
// and the public key at pubPath, both key files (mode 0600, never replacing
// an existing file; see keyfile.Create).
func WriteKeyPair(privPath, pubPath string) (ed25519.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	if err := keyfile.Create(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return nil, err
	}
	if err := keyfile.Create(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})); err != nil {
		return nil, err
	}
	return pub, nil
}

// LoadSigningKey reads the fleet's private key, a key file that passes
// pkg/keyfile's checks. It is never created here: a gateway that does not
// know the matching public key would refuse every grant.
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	b, err := keyfile.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("grant key %s: %w (create a pair with `tetherctl certs init DIR`)", path, err)
	}
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("grant key %s: no PEM PRIVATE KEY block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("grant key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("grant key %s: not an Ed25519 key", path)
	}
	return priv, nil
}

// LoadPublicKeys reads every PEM PUBLIC KEY block of the comma-separated
// files (the fleet's current key, and the next or previous one while keys
// rotate).
func LoadPublicKeys(files string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for _, path := range strings.Split(files, ",") {
		if path = strings.TrimSpace(path); path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("grant public key: %w", err)
		}
		n := 0
		for {
			var blk *pem.Block
			blk, b = pem.Decode(b)
			if blk == nil {
				break
			}
			if blk.Type != "PUBLIC KEY" {
				continue
			}
			k, err := x509.ParsePKIXPublicKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("grant public key %s: %w", path, err)
			}
			pub, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("grant public key %s: not an Ed25519 key", path)
			}
			keys = append(keys, pub)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("grant public key %s: no PEM PUBLIC KEY block", path)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no grant public key configured (-grant-public-keys; create a pair with `tetherctl certs init DIR`)")
	}
	return keys, nil
}
