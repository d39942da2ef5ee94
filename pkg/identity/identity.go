// Package identity names tether's services on the internal plane (SPEC S2).
// Off loopback every service speaks mutual TLS, and a peer's identity is
// the URI SAN of its verified certificate, spiffe://tether/<role>:
//
//	executor         may call gateways, the backup verifier and executors
//	runnergw         may call the backup verifier
//	backup-verifier  calls nobody
//	client           (tetherctl, grpcurl, your service) may call executors only
//
// pkg/devpki writes a development CA and one certificate per role.
package identity

import (
	"crypto/x509"
	"net/url"
	"strings"
)

// TrustDomain is the host part of tether's identity URIs.
const TrustDomain = "tether"

// Roles.
const (
	Executor       = "executor"
	Gateway        = "runnergw"
	BackupVerifier = "backup-verifier"
	Client         = "client"
)

// Roles lists every role, in the order devpki.InitDev writes them.
var Roles = []string{Executor, Gateway, BackupVerifier, Client}

// URI is the identity URI of role.
func URI(role string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + role}
}

// RolesOf returns the roles a (verified) certificate names in its URI SANs.
func RolesOf(cert *x509.Certificate) []string {
	var roles []string
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != TrustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			continue
		}
		role := strings.TrimPrefix(u.Path, "/")
		if role != "" && !strings.Contains(role, "/") {
			roles = append(roles, role)
		}
	}
	return roles
}
