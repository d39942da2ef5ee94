// Package secrets seals the credentials runs name by reference (SPEC T3).
//
// A company's secret is stored in PostgreSQL with envelope encryption: each
// version gets a fresh random data key that seals the value, and the data
// key is sealed with the key-encryption key of the executor fleet's key
// file (-secrets-key-file, a 0600 key file like the others). Both seals are
// NaCl secretbox (XSalsa20-Poly1305, golang.org/x/crypto) with a random
// nonce; the sealed value binds the company and the name, so a row copied
// under another company or name does not open. A row records the id of the
// key that wrapped it (a digest of the key), so a wrong key file is named
// as such instead of failing as corruption.
package secrets

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/crypto/nacl/secretbox"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/services/executor/internal/store"
)

const (
	keySize   = 32
	nonceSize = 24
)

// Keyring holds the key-encryption key.
type Keyring struct {
	kek [keySize]byte
	id  string
}

// Load reads (creating it when missing) the key file at path.
func Load(path string) (*Keyring, error) {
	b, err := keyfile.LoadOrCreate(path)
	if err != nil {
		return nil, err
	}
	return New(b)
}

// New returns the keyring of key (at least 32 bytes: the first 32 are the
// key-encryption key).
func New(key []byte) (*Keyring, error) {
	if len(key) < keySize {
		return nil, fmt.Errorf("secrets: a key needs %d bytes, got %d", keySize, len(key))
	}
	k := &Keyring{}
	copy(k.kek[:], key)
	sum := sha256.Sum256(append([]byte("tether secrets key id\x00"), k.kek[:]...))
	k.id = hex.EncodeToString(sum[:8])
	return k, nil
}

// KeyID names the key-encryption key (not secret: a digest of it).
func (k *Keyring) KeyID() string { return k.id }

// Sealed is one stored secret version.
type Sealed = store.SealedSecret

func seal(key *[keySize]byte, msg []byte) ([]byte, error) {
	var nonce [nonceSize]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	return secretbox.Seal(nonce[:], msg, &nonce, key), nil
}

func open(key *[keySize]byte, box []byte) ([]byte, bool) {
	if len(box) < nonceSize+secretbox.Overhead {
		return nil, false
	}
	var nonce [nonceSize]byte
	copy(nonce[:], box[:nonceSize])
	return secretbox.Open(nil, box[nonceSize:], &nonce, key)
}

// binding is what a sealed value starts with: the company and name it
// belongs to.
func binding(company, name string) []byte {
	return []byte(company + "\x00" + name + "\x00")
}

// Seal encrypts value as company's secret name.
func (k *Keyring) Seal(company, name string, value []byte) (*Sealed, error) {
	var dek [keySize]byte
	if _, err := rand.Read(dek[:]); err != nil {
		return nil, err
	}
	wrapped, err := seal(&k.kek, dek[:])
	if err != nil {
		return nil, err
	}
	v, err := seal(&dek, append(binding(company, name), value...))
	if err != nil {
		return nil, err
	}
	return &Sealed{KeyID: k.id, DataKey: wrapped, Value: v}, nil
}

// Open decrypts company's secret name.
func (k *Keyring) Open(company, name string, s *Sealed) ([]byte, error) {
	if s.KeyID != k.id {
		return nil, failure.New(codes.FailedPrecondition, failure.SecretUnreadable,
			"secret %q of company %s was sealed with key %s, this executor holds key %s (-secrets-key-file)", name, company, s.KeyID, k.id)
	}
	dek, ok := open(&k.kek, s.DataKey)
	if !ok || len(dek) != keySize {
		return nil, failure.New(codes.FailedPrecondition, failure.SecretUnreadable, "secret %q of company %s: its data key does not open", name, company)
	}
	var d [keySize]byte
	copy(d[:], dek)
	plain, ok := open(&d, s.Value)
	b := binding(company, name)
	if !ok || len(plain) < len(b) || !hmac.Equal(plain[:len(b)], b) {
		return nil, failure.New(codes.FailedPrecondition, failure.SecretUnreadable, "secret %q of company %s does not open", name, company)
	}
	return plain[len(b):], nil
}

// LegacyName is the secret name a plain environment.configured value of
// variable env is stored under for company: "env.<NAME>.<digest>", the
// digest keyed with the key-encryption key, so the name reveals nothing
// about the value to whoever lacks the key, and the same value of the same
// variable is the same secret (an identical resubmission is idempotent).
func (k *Keyring) LegacyName(company, env string, value string) string {
	m := hmac.New(sha256.New, k.kek[:])
	m.Write([]byte("tether configured env\x00" + company + "\x00" + env + "\x00" + value))
	return "env." + nameSafe(env) + "." + hex.EncodeToString(m.Sum(nil)[:12])
}

// nameSafe maps env to secret-name characters ([A-Za-z0-9._:-]), bounded.
func nameSafe(env string) string {
	var b strings.Builder
	for _, r := range env {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.', r == ':':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= 120 {
			break
		}
	}
	return b.String()
}

// Store keeps sealed secrets (the executor's store).
type Store interface {
	SealedSecrets(ctx context.Context, company string, names []string) (map[string]*Sealed, error)
	EnsureSecret(ctx context.Context, company, name, by string, v *Sealed) error
}

// Vault resolves and stores the secrets of runs.
type Vault struct {
	Keys  *Keyring
	Store Store
}

// Resolve returns the values of a run's secret references (variable name
// -> value) for company; nil without references. A missing secret is
// secret_not_found.
func (v *Vault) Resolve(ctx context.Context, company string, refs map[string]string) (map[string]string, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(refs))
	for _, n := range refs {
		names = append(names, n)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	sealed, err := v.Store.SealedSecrets(ctx, company, names)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(refs))
	for env, n := range refs {
		b, err := v.Keys.Open(company, n, sealed[n])
		if err != nil {
			return nil, err
		}
		out[env] = string(b)
	}
	return out, nil
}

// ByReference returns in with its plain environment.configured values
// stored as company secrets and replaced by references (SPEC T3: a run's
// stored input never carries a value); in itself is not changed. An input
// without configured values is returned as is. A variable named both ways
// keeps its reference.
func (v *Vault) ByReference(ctx context.Context, by string, in *prpv1.ExecutionInput) (*prpv1.ExecutionInput, error) {
	conf := in.GetEnvironment().GetConfigured()
	if len(conf) == 0 {
		return in, nil
	}
	company := in.GetBinding().GetCompanyId()
	out := proto.CloneOf(in)
	env := out.GetEnvironment()
	if env.SecretRefs == nil {
		env.SecretRefs = map[string]string{}
	}
	for k, val := range conf {
		if _, ok := env.SecretRefs[k]; ok {
			continue
		}
		name := v.Keys.LegacyName(company, k, val)
		sealed, err := v.Keys.Seal(company, name, []byte(val))
		if err != nil {
			return nil, err
		}
		if err := v.Store.EnsureSecret(ctx, company, name, by, sealed); err != nil {
			return nil, err
		}
		env.SecretRefs[k] = name
	}
	env.Configured = nil
	return out, nil
}
