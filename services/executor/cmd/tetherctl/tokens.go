package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/devpki"
	"github.com/tether-run/tether/pkg/tenancy"
)

// tokensCmd: tokens init DIR | tokens mint -key K -subject N -role G...
func tokensCmd(args []string, w io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: tetherctl tokens init DIR | tokens mint -key FILE -subject NAME -role GRANT... [-ttl 24h]")
	}
	switch args[0] {
	case "init":
		if len(args) != 2 {
			return errors.New("usage: tetherctl tokens init DIR")
		}
		dir := args[1]
		priv, jwks := filepath.Join(dir, tenancy.SigningKeyFile), filepath.Join(dir, tenancy.JWKSFile)
		if err := tenancy.WriteSigningKey(priv, jwks); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote the token signing key %s (mode 0600) and its JWKS %s\n  executor:  -auth-jwks %[2]s\n  tokens:    tetherctl tokens mint -key %[1]s -subject alice -role acme:writer\n", priv, jwks)
		return nil
	case "mint":
		return tokensMint(args[1:], w)
	}
	return fmt.Errorf("tokens: unknown command %q (init, mint)", args[0])
}

func tokensMint(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("tokens mint", flag.ContinueOnError)
	key := fs.String("key", "", "token signing key (tokens init wrote DIR/"+tenancy.SigningKeyFile+"; required)")
	subject := fs.String("subject", "", "the principal's name (required)")
	ttl := fs.Duration("ttl", 24*time.Hour, "validity")
	var roles listFlag
	fs.Var(&roles, "role", "a grant: COMPANY:reader, COMPANY:writer or operator (repeatable; at least one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *key == "" || *subject == "" || len(roles) == 0 {
		return errors.New("tokens mint: -key, -subject and at least one -role are required")
	}
	m, err := tenancy.LoadMinter(*key)
	if err != nil {
		return err
	}
	tok, err := m.Mint(*subject, roles, *ttl, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(w, tok)
	return nil
}

// certsIssue writes a client certificate naming a principal: certs issue
// DIR -name N -role GRANT... (DIR holds a development CA from certs init).
func certsIssue(args []string) error {
	fs := flag.NewFlagSet("certs issue", flag.ContinueOnError)
	name := fs.String("name", "", "the principal's name; the files are DIR/NAME.pem and DIR/NAME.key (required)")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the certificate is valid")
	var roles listFlag
	fs.Var(&roles, "role", "a grant: COMPANY:reader, COMPANY:writer or operator (repeatable; at least one)")
	dir, rest := "", args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		dir, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if dir == "" || *name == "" || len(roles) == 0 {
		return errors.New("usage: tetherctl certs issue DIR -name N -role GRANT... [-validity 8760h]")
	}
	uris, err := tenancy.GrantURIs(*name, roles)
	if err != nil {
		return err
	}
	if err := devpki.IssueDev(dir, *name, uris, *validity); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s\n  tetherctl: -ca %s -cert %[1]s -key %[2]s\n",
		devpki.CertFile(dir, *name), devpki.KeyFile(dir, *name), filepath.Join(dir, devpki.CAFile))
	return nil
}
