package secrets_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/secrets"
)

// TestT3_ASealedSecretOpensOnlyWithItsKeyCompanyAndName: the value is not
// in the sealed row; the row opens with the key that sealed it, for the
// company and name it was sealed for; under another key, company or name
// (a row copied elsewhere) it is secret_unreadable. Two seals of one value
// differ (fresh data key and nonces).
func TestT3_ASealedSecretOpensOnlyWithItsKeyCompanyAndName(t *testing.T) {
	t.Parallel()
	k, err := secrets.Load(filepath.Join(t.TempDir(), "secrets.key"))
	require.NoError(t, err)
	other, err := secrets.Load(filepath.Join(t.TempDir(), "secrets.key"))
	require.NoError(t, err)
	require.NotEqual(t, k.KeyID(), other.KeyID())
	value := []byte("sk-canary-value-0123456789")
	s, err := k.Seal("acme", "openai", value)
	require.NoError(t, err)
	require.False(t, bytes.Contains(s.Value, value) || bytes.Contains(s.DataKey, value))
	got, err := k.Open("acme", "openai", s)
	require.NoError(t, err)
	require.Equal(t, value, got)

	s2, err := k.Seal("acme", "openai", value)
	require.NoError(t, err)
	require.NotEqual(t, s.Value, s2.Value)
	require.NotEqual(t, s.DataKey, s2.DataKey)

	for name, open := range map[string]func() ([]byte, error){
		"another key":     func() ([]byte, error) { return other.Open("acme", "openai", s) },
		"another company": func() ([]byte, error) { return k.Open("globex", "openai", s) },
		"another name":    func() ([]byte, error) { return k.Open("acme", "github", s) },
		"a forged key id": func() ([]byte, error) {
			forged := *s
			forged.KeyID = other.KeyID()
			return other.Open("acme", "openai", &forged)
		},
	} {
		_, err := open()
		require.EqualValues(t, failure.SecretUnreadable, failure.CodeOf(err), "%s: %v", name, err)
	}
	// A legacy configured value's name is keyed: the same value and
	// variable is one name, under another key another name.
	require.Equal(t, k.LegacyName("acme", "OPENAI_API_KEY", "x"), k.LegacyName("acme", "OPENAI_API_KEY", "x"))
	require.NotEqual(t, k.LegacyName("acme", "OPENAI_API_KEY", "x"), k.LegacyName("acme", "OPENAI_API_KEY", "y"))
	require.NotEqual(t, k.LegacyName("acme", "OPENAI_API_KEY", "x"), other.LegacyName("acme", "OPENAI_API_KEY", "x"))
}
