package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/devpki"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/tenancy"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// certs writes a development PKI: tetherctl certs init DIR [-host H]...
func certs(args []string) error {
	if len(args) > 0 && args[0] == "issue" {
		return certsIssue(args[1:])
	}
	if len(args) == 0 || args[0] != "init" {
		return errors.New("usage: tetherctl certs init DIR [-host NAME|IP]... [-validity 8760h] | certs issue DIR -name N -role GRANT...")
	}
	fs := flag.NewFlagSet("certs init", flag.ContinueOnError)
	var hosts listFlag
	fs.Var(&hosts, "host", "extra DNS name or IP address in every service certificate (repeatable)")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the CA and certificates are valid")
	dir, rest := "", args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		dir, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if dir == "" && fs.NArg() == 1 {
		dir = fs.Arg(0)
	}
	if dir == "" {
		return errors.New("certs init: a directory is required")
	}
	if err := devpki.InitDev(dir, hosts, *validity); err != nil {
		return err
	}
	// The development operator (SPEC T1): the client certificate names no
	// principal and is refused where the executor requires identities.
	if err := devpki.IssueDev(dir, tenancy.OperatorName, []*url.URL{tenancy.OperatorURI(tenancy.OperatorName)}, *validity); err != nil {
		return err
	}
	fmt.Printf("wrote a development CA, certificates for %s and the grant key pair to %s (mode 0600)\n",
		strings.Join(identity.Roles, ", "), dir)
	fmt.Printf("  executor:        -tls-cert %s -tls-key %s -tls-client-ca %s -gateway-ca %[3]s -grant-key-file %s\n",
		devpki.CertFile(dir, identity.Executor), devpki.KeyFile(dir, identity.Executor), filepath.Join(dir, devpki.CAFile), filepath.Join(dir, devpki.GrantKeyFile))
	fmt.Printf("  runnergw:        -tls-cert %s -tls-key %s -tls-client-ca %s -backup-ca %[3]s -grant-public-keys %s\n",
		devpki.CertFile(dir, identity.Gateway), devpki.KeyFile(dir, identity.Gateway), filepath.Join(dir, devpki.CAFile), filepath.Join(dir, devpki.GrantPublicKey))
	fmt.Printf("  backup-verifier: -tls-cert %s -tls-key %s -tls-client-ca %s\n",
		devpki.CertFile(dir, identity.BackupVerifier), devpki.KeyFile(dir, identity.BackupVerifier), filepath.Join(dir, devpki.CAFile))
	fmt.Printf("  tetherctl:       -ca %s -cert %s -key %s (an operator; tetherctl certs issue %s -name N -role acme:writer for a company's principal)\n",
		filepath.Join(dir, devpki.CAFile), devpki.CertFile(dir, tenancy.OperatorName), devpki.KeyFile(dir, tenancy.OperatorName), dir)
	return nil
}

// grantCmd prints a grant for an operator's call to a gateway (ListRunners
// or GetRunner), signed with the fleet key; a gateway accepts it once:
//
//	grpcurl -plaintext -H "tether-grant: $(tetherctl grant -key-file K)" 127.0.0.1:7401 tether.gateway.v1.RunnerGateway/ListRunners
func grantCmd(args []string) error {
	fs := flag.NewFlagSet("grant", flag.ContinueOnError)
	keyFile := fs.String("key-file", "", "the executor fleet's grant private key (required)")
	gatewayID := fs.String("gateway-id", "runnergw", "the gateway's id (audience)")
	method := fs.String("method", grant.MethodListRunners, "ListRunners or GetRunner")
	ttl := fs.Duration("ttl", time.Minute, "validity")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *method != grant.MethodListRunners && *method != grant.MethodGetRunner {
		return fmt.Errorf("grant: -method %s: only ListRunners and GetRunner (run calls are granted by executors)", *method)
	}
	key, err := grant.LoadSigningKey(*keyFile)
	if err != nil {
		return err
	}
	tok, err := grant.NewSigner(key, *ttl, nil).Sign(grant.Claims{Method: *method, Audience: *gatewayID})
	if err != nil {
		return err
	}
	fmt.Println(tok)
	return nil
}
