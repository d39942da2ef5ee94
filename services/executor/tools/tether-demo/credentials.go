package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// devPrincipals are the development identities -up -auth writes: a
// writer and a reader of companies acme and globex, and an operator.
var devPrincipals = []struct{ file, subject, grant string }{
	{"acme-writer", "acme-writer", "acme:writer"},
	{"acme-reader", "acme-reader", "acme:reader"},
	{"globex-writer", "globex-writer", "globex:writer"},
	{"globex-reader", "globex-reader", "globex:reader"},
	{"operator", "operator", "operator"},
}

// writeCredentials writes a token per development principal into dir
// (0700, files 0600) and prints how to use them.
func writeCredentials(st *stack.Stack, dir string, w io.Writer) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, p := range devPrincipals {
		tok, err := st.Token(p.subject, 24*time.Hour, p.grant)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, p.file+".token"), []byte(tok+"\n"), 0o600); err != nil {
			return err
		}
	}
	addr := st.Addr("executor")
	fmt.Fprintf(w, `demo: tenancy is enforced (SPEC T1, T2): every call needs a bearer token. Development tokens (24h) in %[1]s:
  acme-writer.token acme-reader.token globex-writer.token globex-reader.token operator.token
  (JWKS %[2]s; mint more with bin/tetherctl tokens mint -key %[3]s -subject NAME -role acme:writer)
  e.g.  TETHER_TOKEN=$(cat %[1]s/acme-writer.token) bin/tetherctl -addr %[4]s submit -company acme -session s1 -prompt hi -watch
        TETHER_TOKEN=$(cat %[1]s/globex-writer.token) bin/tetherctl -addr %[4]s list          # globex sees none of acme's runs
        grpcurl -plaintext -H "authorization: Bearer $(cat %[1]s/globex-writer.token)" -d '{"run_id":"RUN"}' %[4]s tether.executor.v1.ExecutorService/GetRun   # NotFound for acme's RUN
`, dir, st.JWKSFile(), st.TokenKeyFile(), addr)
	return nil
}
