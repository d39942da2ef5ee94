package k8s

import (
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestD4_EachGatewayPodRegistersUnderItsOwnIDAndAddressBehindAHeadlessService:
// the gateway StatefulSet runs more than one pod; each announces itself to
// the executors' registry under its pod name (from the downward API) at its
// own DNS name in a headless Service (so no load balancer spreads a
// session's calls over pods with different disks); a PDB keeps one
// gateway through voluntary disruptions; a stopping pod drains itself
// within its grace period; the executors' static gateway is pod 0 under
// its registered id, verified as runnergw.
func TestD4_EachGatewayPodRegistersUnderItsOwnIDAndAddressBehindAHeadlessService(t *testing.T) {
	o := render(t)
	ss := o.statefulSet(t, "runnergw")
	if r := ptrOr(ss.Spec.Replicas, 1); r < 2 {
		t.Errorf("runnergw runs %d pod(s): a fleet needs at least 2", r)
	}
	c := ss.Spec.Template.Spec.Containers[0]
	var podName bool
	for _, e := range c.Env {
		podName = podName || e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}
	if !podName {
		t.Error("runnergw: POD_NAME must come from the downward API (metadata.name)")
	}
	grpcPort := strconv.Itoa(int(port(c, "grpc")))
	for name, want := range map[string]string{
		"TETHER_GATEWAY_ID":     "$(POD_NAME)",
		"TETHER_ADVERTISE_ADDR": "$(POD_NAME)." + ss.Spec.ServiceName + ":" + grpcPort,
		"TETHER_REGISTRY_ADDR":  "executor:7400",
	} {
		if v, _ := envValue(c, name); v != want {
			t.Errorf("runnergw: %s=%q, want %q", name, v, want)
		}
	}
	svc := o.service(t, ss.Spec.ServiceName)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s must be headless (clusterIP: None), not %q", svc.Name, svc.Spec.ClusterIP)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s must publish not-ready addresses: a terminating (draining) gateway pod must stay reachable", svc.Name)
	}
	if !covered(o.pdbs, ss.Spec.Template.Labels, func(p *policyv1.PodDisruptionBudget) (*metav1.LabelSelector, bool) {
		return p.Spec.Selector, p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() >= 1
	}) {
		t.Error("runnergw: no PodDisruptionBudget keeping at least one gateway")
	}
	wait, _ := envValue(c, "TETHER_DRAIN_WAIT")
	d := parseDuration(t, wait)
	grace := ss.Spec.Template.Spec.TerminationGracePeriodSeconds
	if d <= 0 || grace == nil || float64(*grace) < d.Seconds()+30 {
		t.Errorf("runnergw: TETHER_DRAIN_WAIT=%q must be set and at least 30 s below terminationGracePeriodSeconds (%v)", wait, grace)
	}
	ex := o.deployment(t, "executor").Spec.Template.Spec.Containers[0]
	addr, _ := envValue(ex, "TETHER_GATEWAY_ADDR")
	id, _ := envValue(ex, "TETHER_GATEWAY_ID")
	name, _ := envValue(ex, "TETHER_GATEWAY_SERVER_NAME")
	if addr != ss.Name+"-0."+ss.Spec.ServiceName+":"+grpcPort || id != ss.Name+"-0" || name != "runnergw" {
		t.Errorf("executor: static gateway %s id %s server name %s; want pod 0 under its registered id, verified as runnergw", addr, id, name)
	}
}

// TestD4_AgentCodeInAGatewayPodReachesOnlyTheControlPlaneAndPublicModelEndpoints:
// an egress NetworkPolicy selects the gateway pods (where runnerd and the
// provider run) and admits DNS, the executors' registry port, the backup
// verifier and public addresses on 443 — not PostgreSQL, not a private
// address (the API server, other pods), not the cloud metadata address.
func TestD4_AgentCodeInAGatewayPodReachesOnlyTheControlPlaneAndPublicModelEndpoints(t *testing.T) {
	o := render(t)
	labels := o.statefulSet(t, "runnergw").Spec.Template.Labels
	var egress []networkingv1.NetworkPolicyEgressRule
	for _, p := range o.policies {
		if selects(&p.Spec.PodSelector, labels) && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			egress = append(egress, p.Spec.Egress...)
		}
	}
	if len(egress) == 0 {
		t.Fatal("no egress NetworkPolicy selects the gateway pods: agent code reaches everything")
	}
	// allows reports whether some rule admits the address (nil: a pod
	// with the labels) on port.
	allows := func(ip string, podLabels map[string]string, port int) bool {
		for _, r := range egress {
			if !slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntValue() == port }) && len(r.Ports) > 0 {
				continue
			}
			for _, to := range r.To {
				switch {
				case to.IPBlock != nil && ip != "":
					if inBlock(t, ip, to.IPBlock) {
						return true
					}
				case to.PodSelector != nil && podLabels != nil:
					if selects(to.PodSelector, podLabels) {
						return true
					}
				}
			}
			if len(r.To) == 0 {
				return true
			}
		}
		return false
	}
	ex := o.deployment(t, "executor").Spec.Template.Labels
	bv := o.statefulSet(t, "backup-verifier").Spec.Template.Labels
	for _, tc := range []struct {
		what  string
		ip    string
		pod   map[string]string
		port  int
		allow bool
	}{
		{"DNS", "", map[string]string{"k8s-app": "kube-dns"}, 53, true},
		{"the executors' registry", "", ex, 7400, true},
		{"the backup verifier", "", bv, 7402, true},
		{"a public model endpoint", "203.0.113.7", nil, 443, true},
		{"PostgreSQL", "10.0.4.20", nil, 5432, false},
		{"a private address on 443 (the API server's service IP)", "10.96.0.1", nil, 443, false},
		{"another pod's address", "172.16.3.9", nil, 443, false},
		{"the cloud metadata address", "169.254.169.254", nil, 80, false},
		{"the cloud metadata address on 443", "169.254.169.254", nil, 443, false},
		{"a public address off 443", "203.0.113.7", nil, 22, false},
		{"the executors' metrics", "", ex, 9400, false},
	} {
		if got := allows(tc.ip, tc.pod, tc.port); got != tc.allow {
			t.Errorf("gateway pod egress to %s (port %d): allowed %v, want %v", tc.what, tc.port, got, tc.allow)
		}
	}
}

// TestD4_EachServiceMountsOnlyItsOwnSecretAndTheCAKeyIsNeverInTheCluster:
// every workload's secret volumes name its own PKI Secret and hold only its
// own certificate and keys (no other service's key, never the CA's private
// key), and the README's recipe creates one Secret per service from named
// files, never the whole pki/ directory.
func TestD4_EachServiceMountsOnlyItsOwnSecretAndTheCAKeyIsNeverInTheCluster(t *testing.T) {
	o := render(t)
	names := map[string]bool{}
	for _, w := range o.workloads() {
		names[w.name] = true
	}
	for _, w := range o.workloads() {
		for _, v := range w.spec.Spec.Volumes {
			if v.Secret == nil || v.Secret.SecretName == "tether-database" {
				continue
			}
			if v.Secret.SecretName != pkiSecret(w.name) {
				t.Errorf("%s mounts Secret %s, not its own %s", w.name, v.Secret.SecretName, pkiSecret(w.name))
			}
			if len(v.Secret.Items) == 0 {
				t.Errorf("%s: Secret %s mounted whole; list the items", w.name, v.Secret.SecretName)
			}
			for _, it := range v.Secret.Items {
				base := strings.TrimSuffix(strings.TrimSuffix(it.Key, ".key"), ".pem")
				if it.Key == "ca.key" || names[base] && base != w.name {
					t.Errorf("%s mounts %s", w.name, it.Key)
				}
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(readme), "--from-file=pki/ ") || strings.Contains(string(readme), "--from-file=pki/\n") ||
		strings.Contains(string(readme), "ca.key --") || strings.Contains(string(readme), "--from-file=pki/ca.key") {
		t.Error("README.md puts the whole pki/ directory or the CA key into a Secret")
	}
	for w := range names {
		if !strings.Contains(string(readme), "create secret generic "+pkiSecret(w)) {
			t.Errorf("README.md does not create %s", pkiSecret(w))
		}
	}
}

func inBlock(t *testing.T, ip string, b *networkingv1.IPBlock) bool {
	t.Helper()
	addr := netip.MustParseAddr(ip)
	if !netip.MustParsePrefix(b.CIDR).Contains(addr) {
		return false
	}
	for _, ex := range b.Except {
		if netip.MustParsePrefix(ex).Contains(addr) {
			return false
		}
	}
	return true
}

func (o *objects) statefulSet(t *testing.T, name string) *appsv1.StatefulSet {
	return named(t, o.statefulSets, "StatefulSet", name)
}

func (o *objects) deployment(t *testing.T, name string) *appsv1.Deployment {
	return named(t, o.deployments, "Deployment", name)
}

func (o *objects) service(t *testing.T, name string) *corev1.Service {
	return named(t, o.services, "Service", name)
}

// named returns the object of kind called name among objs.
func named[T interface{ GetName() string }](t *testing.T, objs []T, kind, name string) T {
	t.Helper()
	for _, x := range objs {
		if x.GetName() == name {
			return x
		}
	}
	t.Fatalf("no %s %s", kind, name)
	var zero T
	return zero
}

func parseDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Errorf("%q: %v", s, err)
	}
	return d
}
