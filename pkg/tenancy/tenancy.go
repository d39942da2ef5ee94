// Package tenancy names the callers of tether's client plane (SPEC T1): a
// principal holds roles per company, and operators act for every company.
//
// Roles:
//
//	reader    get, list and watch the company's runs, sessions and interactions
//	writer    a reader that also submits, cancels, steers, resolves runtime
//	          requests, completes tool calls, answers interactions and closes
//	          the company's sessions
//	operator  fleet and session administration and audit, for every company
//
// A principal comes from a verified client certificate or from a bearer
// token (a JWT, see Verifier). Both carry the same grants, written
// "<company>:<role>" or "operator":
//
//   - certificate: one URI SAN per grant,
//     spiffe://tether/company/<company>/principal/<name>/role/<reader|writer>
//     or spiffe://tether/operator/<name>, all naming the same principal;
//   - token: the subject is the name and the "tether_roles" claim lists
//     the grants.
package tenancy

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Role is what a principal may do for a company.
type Role string

// Roles, weakest first.
const (
	Reader   Role = "reader"
	Writer   Role = "writer"
	Operator Role = "operator"
)

// Allows reports whether holding r grants need (a writer is also a reader).
func (r Role) Allows(need Role) bool {
	rank := map[Role]int{Reader: 1, Writer: 2, Operator: 3}
	return rank[r] > 0 && rank[r] >= rank[need]
}

// Source says how a principal was authenticated.
type Source string

// Sources.
const (
	SourceCertificate Source = "cert"
	SourceToken       Source = "token"
	// SourceService is a tether service on the internal plane (an
	// executor forwarding a call, a gateway registering).
	SourceService Source = "service"
)

// namePattern bounds principal names and company ids in URIs and tokens.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$`)

// ValidName reports whether s may name a principal or a company.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// Principal is an authenticated caller.
type Principal struct {
	// Name is the certificate's principal name or the token's subject.
	Name   string
	Source Source
	// Operator acts for every company.
	Operator bool
	// Roles maps a company to the principal's role there.
	Roles map[string]Role
}

// String names the principal in audit records and requested_by:
// "token:alice", "cert:alice", "service:executor".
func (p *Principal) String() string {
	if p == nil {
		return "anonymous"
	}
	return string(p.Source) + ":" + p.Name
}

// Can reports whether the principal may act as need for company.
func (p *Principal) Can(company string, need Role) bool {
	if p == nil {
		return false
	}
	if p.Operator {
		return true
	}
	return need != Operator && p.Roles[company].Allows(need)
}

// Companies lists the companies the principal holds a role in, sorted;
// nil for an operator (every company).
func (p *Principal) Companies() []string {
	if p == nil || p.Operator {
		return nil
	}
	return p.granted()
}

// granted lists the companies named in the principal's grants, sorted.
func (p *Principal) granted() []string {
	out := make([]string, 0, len(p.Roles))
	for c := range p.Roles {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// ParseGrants builds a principal named name from grants ("acme:writer",
// "globex:reader", "operator").
func ParseGrants(name string, src Source, grants []string) (*Principal, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("tenancy: invalid principal name %q", name)
	}
	p := &Principal{Name: name, Source: src, Roles: map[string]Role{}}
	for _, g := range grants {
		if g == string(Operator) {
			p.Operator = true
			continue
		}
		company, role, ok := strings.Cut(g, ":")
		if !ok || !ValidName(company) || (Role(role) != Reader && Role(role) != Writer) {
			return nil, fmt.Errorf("tenancy: invalid grant %q (want <company>:reader, <company>:writer or operator)", g)
		}
		if Role(role).Allows(p.Roles[company]) {
			p.Roles[company] = Role(role)
		}
	}
	if !p.Operator && len(p.Roles) == 0 {
		return nil, errors.New("tenancy: a principal needs at least one grant")
	}
	return p, nil
}

// trustDomain is the host of tether's identity URIs (pkg/identity).
const trustDomain = "tether"

// CompanyURI is the certificate URI SAN granting name role in company.
func CompanyURI(company, name string, role Role) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain,
		Path: "/company/" + company + "/principal/" + name + "/role/" + string(role)}
}

// OperatorName is the development operator's name (the operator.pem
// `tetherctl certs init` writes).
const OperatorName = "operator"

// OperatorURI is the certificate URI SAN of operator name.
func OperatorURI(name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/operator/" + name}
}

// GrantURIs are the URI SANs of a certificate carrying grants for name.
func GrantURIs(name string, grants []string) ([]*url.URL, error) {
	p, err := ParseGrants(name, SourceCertificate, grants)
	if err != nil {
		return nil, err
	}
	var out []*url.URL
	if p.Operator {
		out = append(out, OperatorURI(name))
	}
	for _, c := range p.granted() {
		out = append(out, CompanyURI(c, name, p.Roles[c]))
	}
	return out, nil
}

// FromCertificate returns the principal a verified certificate names in
// its URI SANs, or nil when it names none (a service certificate). A
// certificate naming two principals is refused.
func FromCertificate(cert *x509.Certificate) (*Principal, error) {
	var (
		name   string
		grants []string
	)
	for _, u := range cert.URIs {
		n, g, ok := parseURI(u)
		if !ok {
			continue
		}
		if name != "" && n != name {
			return nil, fmt.Errorf("tenancy: certificate names two principals (%s, %s)", name, n)
		}
		name = n
		grants = append(grants, g)
	}
	if name == "" {
		return nil, nil
	}
	return ParseGrants(name, SourceCertificate, grants)
}

// parseURI reads one tenancy URI SAN: its principal name and grant.
func parseURI(u *url.URL) (name, grant string, ok bool) {
	if u.Scheme != "spiffe" || u.Host != trustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", false
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	switch {
	case len(parts) == 2 && parts[0] == "operator" && ValidName(parts[1]):
		return parts[1], string(Operator), true
	case len(parts) == 6 && parts[0] == "company" && parts[2] == "principal" && parts[4] == "role" &&
		ValidName(parts[1]) && ValidName(parts[3]) && slices.Contains([]Role{Reader, Writer}, Role(parts[5])):
		return parts[3], parts[1] + ":" + parts[5], true
	}
	return "", "", false
}
