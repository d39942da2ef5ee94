package k8s

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// services are the tether binaries the manifests run, with their command
// package in the repository.
var services = map[string]string{
	"executor":        "./services/executor/cmd/executor",
	"runnergw":        "./services/runnergw/cmd/runnergw",
	"backup-verifier": "./services/backup/cmd/backup-verifier",
	"tetherctl":       "./services/executor/cmd/tetherctl",
}

// objects is what the kustomization renders, decoded strictly.
type objects struct {
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	pdbs         []*policyv1.PodDisruptionBudget
	policies     []*networkingv1.NetworkPolicy
	namespaces   []*corev1.Namespace
	jobs         []*batchv1.Job
}

// workload is a pod template with what owns it.
type workload struct {
	kind, name string
	replicas   int32
	spec       corev1.PodTemplateSpec
	claims     []corev1.PersistentVolumeClaim
}

func (o *objects) workloads() []workload {
	var w []workload
	for _, d := range o.deployments {
		w = append(w, workload{"Deployment", d.Name, ptrOr(d.Spec.Replicas, 1), d.Spec.Template, nil})
	}
	for _, s := range o.statefulSets {
		w = append(w, workload{"StatefulSet", s.Name, ptrOr(s.Spec.Replicas, 1), s.Spec.Template, s.Spec.VolumeClaimTemplates})
	}
	return w
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// render builds the kustomization in this directory and decodes every
// object strictly (unknown or duplicate fields fail) into its API type.
func render(t *testing.T) *objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	o := &objects{}
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var into any
		switch r.GetKind() {
		case "Deployment":
			x := &appsv1.Deployment{}
			o.deployments, into = append(o.deployments, x), x
		case "StatefulSet":
			x := &appsv1.StatefulSet{}
			o.statefulSets, into = append(o.statefulSets, x), x
		case "Service":
			x := &corev1.Service{}
			o.services, into = append(o.services, x), x
		case "PodDisruptionBudget":
			x := &policyv1.PodDisruptionBudget{}
			o.pdbs, into = append(o.pdbs, x), x
		case "NetworkPolicy":
			x := &networkingv1.NetworkPolicy{}
			o.policies, into = append(o.policies, x), x
		case "Namespace":
			x := &corev1.Namespace{}
			o.namespaces, into = append(o.namespaces, x), x
		case "Job":
			x := &batchv1.Job{}
			o.jobs, into = append(o.jobs, x), x
		default:
			t.Fatalf("%s %s: a kind this test does not know; add it", r.GetKind(), r.GetName())
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v", r.GetKind(), r.GetName(), err)
		}
		if r.GetKind() != "Namespace" && r.GetNamespace() != "tether" {
			t.Errorf("%s %s: namespace %q, want tether", r.GetKind(), r.GetName(), r.GetNamespace())
		}
	}
	return o
}

// flagsOf returns the flag names a tether binary defines (from its -h).
var flagsOf = func() func(t *testing.T, name string) map[string]bool {
	var (
		once  sync.Once
		err   error
		flags = map[string]map[string]bool{}
	)
	return func(t *testing.T, name string) map[string]bool {
		t.Helper()
		once.Do(func() { flags, err = buildAndListFlags() })
		if err != nil {
			t.Fatal(err)
		}
		f, ok := flags[name]
		if !ok {
			t.Fatalf("%q is not a tether binary", name)
		}
		return f
	}
}()

var (
	binDir string // where the binaries are
	built  string // a directory this test built them into (TestMain removes it)
)

// prebuilt is the directory of binaries `make test` built once for every
// package's tests ($TETHER_TEST_BIN, see pkg/testing/testbin), when it holds ours.
func prebuilt() string {
	dir := os.Getenv("TETHER_TEST_BIN")
	if dir == "" {
		return ""
	}
	for name := range services {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return ""
		}
	}
	return dir
}

func buildAndListFlags() (map[string]map[string]bool, error) {
	dir := prebuilt()
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "tether-k8s-test-"); err != nil {
			return nil, err
		}
		built = dir
		var pkgs []string
		for _, p := range services {
			pkgs = append(pkgs, p)
		}
		cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
		cmd.Dir = "../.."
		// The repository's workspace, not this module's GOWORK=off.
		cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "GOWORK=") })
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	binDir = dir
	flagLine := regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`)
	all := map[string]map[string]bool{}
	for name := range services {
		if name == "tetherctl" {
			continue // its global flags are checked by running the probes
		}
		var out bytes.Buffer
		c := exec.Command(filepath.Join(dir, name), "-h")
		c.Stdout, c.Stderr = &out, &out
		_ = c.Run()
		f := map[string]bool{}
		for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
			f[m[1]] = true
		}
		if !f["grpc-addr"] {
			return nil, fmt.Errorf("%s -h lists no -grpc-addr:\n%s", name, out.String())
		}
		all[name] = f
	}
	return all, nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		_ = os.RemoveAll(built)
	}
	os.Exit(code)
}

// envName is envflag.EnvName: "grpc-addr" → "TETHER_GRPC_ADDR".
func envName(flag string) string {
	return "TETHER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// extraEnv are TETHER_* variables a binary reads besides its flags' own.
var extraEnv = map[string][]string{"runnergw": {"TETHER_CODEX_ARGS"}}

func tetherContainer(c corev1.Container) (string, bool) {
	if len(c.Command) == 0 {
		return "", false
	}
	_, ok := services[c.Command[0]]
	return c.Command[0], ok && c.Command[0] != "tetherctl"
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func port(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func addrPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return int32(n)
}

// TestD2_ManifestsDecodeStrictlyAndNameRealFlags: every object the
// kustomization renders decodes strictly into its Kubernetes type; every
// TETHER_* variable and flag a container passes is one its binary defines;
// the gRPC and metrics addresses match the declared ports.
func TestD2_ManifestsDecodeStrictlyAndNameRealFlags(t *testing.T) {
	o := render(t)
	if len(o.workloads()) != 3 {
		t.Fatalf("want the executor, runnergw and backup-verifier workloads, got %d", len(o.workloads()))
	}
	for _, w := range o.workloads() {
		var seen bool
		for _, c := range w.spec.Spec.Containers {
			bin, ok := tetherContainer(c)
			if !ok {
				continue
			}
			seen = true
			flags := flagsOf(t, bin)
			for _, e := range c.Env {
				if !strings.HasPrefix(e.Name, "TETHER_") || slices.Contains(extraEnv[bin], e.Name) {
					continue
				}
				var known bool
				for f := range flags {
					known = known || envName(f) == e.Name
				}
				if !known {
					t.Errorf("%s/%s: %s is no flag's variable of %s", w.name, c.Name, e.Name, bin)
				}
			}
			for _, a := range c.Args {
				if f, ok := strings.CutPrefix(a, "-"); ok && !flags[strings.TrimLeft(strings.SplitN(f, "=", 2)[0], "-")] {
					t.Errorf("%s/%s: argument %s is no flag of %s", w.name, c.Name, a, bin)
				}
			}
			grpcAddr, _ := envValue(c, "TETHER_GRPC_ADDR")
			metricsAddr, _ := envValue(c, "TETHER_METRICS_ADDR")
			if grpcAddr == "" || metricsAddr == "" {
				t.Fatalf("%s/%s: TETHER_GRPC_ADDR and TETHER_METRICS_ADDR must be set (defaults are loopback)", w.name, c.Name)
			}
			if p := port(c, "grpc"); p == 0 || p != addrPort(t, grpcAddr) {
				t.Errorf("%s/%s: port grpc %d, TETHER_GRPC_ADDR %s", w.name, c.Name, p, grpcAddr)
			}
			if p := port(c, "metrics"); p == 0 || p != addrPort(t, metricsAddr) {
				t.Errorf("%s/%s: port metrics %d, TETHER_METRICS_ADDR %s", w.name, c.Name, p, metricsAddr)
			}
			for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[k]; !ok {
					t.Errorf("%s/%s: no %s request", w.name, c.Name, k)
				}
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				t.Errorf("%s/%s: no memory limit", w.name, c.Name)
			}
			checkTLS(t, w, c)
		}
		if !seen {
			t.Errorf("%s %s runs no tether binary", w.kind, w.name)
		}
		for _, c := range w.spec.Spec.InitContainers {
			if len(c.Resources.Requests) == 0 {
				t.Errorf("%s/%s: init container without resource requests", w.name, c.Name)
			}
		}
	}
}

// pkiSecret is the Secret of a workload's certificates and keys: one per
// service (SPEC D4).
func pkiSecret(workload string) string { return "tether-" + workload + "-pki" }

// checkTLS: the service serves mTLS with files of the volume its init
// container fills from its own PKI Secret, and each file it names is an
// item of that Secret.
func checkTLS(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	items := map[string]bool{}
	for _, v := range w.spec.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == pkiSecret(w.name) {
			for _, it := range v.Secret.Items {
				items["/pki/"+it.Path] = true
			}
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Value, "/pki/") && !items[e.Value] {
			t.Errorf("%s/%s: %s=%s is not an item of the %s Secret", w.name, c.Name, e.Name, e.Value, pkiSecret(w.name))
		}
	}
	for _, name := range []string{"TETHER_TLS_CERT", "TETHER_TLS_KEY", "TETHER_TLS_CLIENT_CA"} {
		if v, _ := envValue(c, name); v == "" {
			t.Errorf("%s/%s: %s unset: services off loopback serve mTLS (SPEC S2)", w.name, c.Name, name)
		}
	}
}

// TestD2_ProbesAskGRPCHealthOnTheServedPort: readiness and startup run
// `tetherctl health` over mTLS against the container's gRPC port (the
// kubelet's gRPC probe speaks no TLS); liveness reads /healthz on the
// metrics port. The probe commands run here against a closed port with a
// real development PKI: they fail to connect, not to parse.
func TestD2_ProbesAskGRPCHealthOnTheServedPort(t *testing.T) {
	o := render(t)
	flagsOf(t, "executor") // builds the binaries
	pki := filepath.Join(t.TempDir(), "pki")
	if out, err := exec.Command(filepath.Join(binDir, "tetherctl"), "certs", "init", pki).CombinedOutput(); err != nil {
		t.Fatalf("tetherctl certs init: %v\n%s", err, out)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	for _, w := range o.workloads() {
		for _, c := range w.spec.Spec.Containers {
			if _, ok := tetherContainer(c); !ok {
				continue
			}
			for kind, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe} {
				if p == nil || p.Exec == nil {
					t.Errorf("%s/%s: %s probe must exec tetherctl health", w.name, c.Name, kind)
					continue
				}
				args := p.Exec.Command
				if len(args) < 2 || args[0] != "tetherctl" || args[len(args)-1] != "health" {
					t.Errorf("%s/%s: %s probe %v is not `tetherctl ... health`", w.name, c.Name, kind, args)
					continue
				}
				i := slices.Index(args, "-addr")
				if i < 0 || addrPort(t, args[i+1]) != port(c, "grpc") {
					t.Errorf("%s/%s: %s probe %v does not ask the grpc port %d", w.name, c.Name, kind, args, port(c, "grpc"))
					continue
				}
				run := slices.Clone(args[1:])
				run[i] = closedAddr
				for j, a := range run {
					run[j] = strings.Replace(a, "/pki/", pki+"/", 1)
				}
				out, err := exec.Command(filepath.Join(binDir, "tetherctl"), run...).CombinedOutput()
				if err == nil || !strings.Contains(string(out), "Unavailable") {
					t.Errorf("%s/%s: %s probe against a closed port: want Unavailable, got %v: %s", w.name, c.Name, kind, err, out)
				}
			}
			lp := c.LivenessProbe
			if lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz" || lp.HTTPGet.Port != intstr.FromString("metrics") {
				t.Errorf("%s/%s: liveness must GET /healthz on the metrics port", w.name, c.Name)
			}
		}
	}
}

// TestD2_TopologyExecutorReplicasGatewayVolumesPoliciesServices checks
// the deployment's shape: ≥ 2 executor replicas under a PDB advertising
// their pod IP; the gateway a StatefulSet whose state root is on a
// per-pod volume; a Service per workload whose ports reach the named
// container ports and whose name is what the peers dial; NetworkPolicies
// that admit exactly the callers of the trust table.
func TestD2_TopologyExecutorReplicasGatewayVolumesPoliciesServices(t *testing.T) {
	o := render(t)
	byName := map[string]workload{}
	for _, w := range o.workloads() {
		byName[w.name] = w
	}
	ex, ok := byName["executor"]
	if !ok || ex.kind != "Deployment" || ex.replicas < 2 {
		t.Fatalf("executor must be a Deployment of at least 2 replicas: %+v", ex.kind)
	}
	exC := ex.spec.Spec.Containers[0]
	if v, _ := envValue(exC, "TETHER_ADVERTISE_ADDR"); v != "$(POD_IP):7400" {
		t.Errorf("executor advertises %q, want $(POD_IP):7400", v)
	}
	var podIP bool
	for _, e := range exC.Env {
		podIP = podIP || e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	}
	if !podIP {
		t.Error("executor: POD_IP must come from the downward API (status.podIP)")
	}
	if !covered(o.pdbs, ex.spec.Labels, func(p *policyv1.PodDisruptionBudget) (*metav1.LabelSelector, bool) {
		return p.Spec.Selector, p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() >= 1
	}) {
		t.Error("executor: no PodDisruptionBudget keeping at least one replica")
	}

	gw, ok := byName["runnergw"]
	if !ok || gw.kind != "StatefulSet" {
		t.Fatal("runnergw must be a StatefulSet")
	}
	root, _ := envValue(gw.spec.Spec.Containers[0], "TETHER_STATE_ROOT")
	var onClaim bool
	for _, m := range gw.spec.Spec.Containers[0].VolumeMounts {
		for _, c := range gw.claims {
			onClaim = onClaim || c.Name == m.Name && strings.HasPrefix(root+"/", strings.TrimSuffix(m.MountPath, "/")+"/")
		}
	}
	if !onClaim {
		t.Errorf("runnergw: the state root %q is not on a volumeClaimTemplate (one volume per pod)", root)
	}

	// Every cross-service address names a Service and one of its ports.
	svc := map[string]*corev1.Service{}
	for _, s := range o.services {
		svc[s.Name] = s
	}
	for _, w := range o.workloads() {
		s, ok := svc[w.name]
		if !ok {
			t.Errorf("%s: no Service", w.name)
			continue
		}
		if !selects(&metav1.LabelSelector{MatchLabels: s.Spec.Selector}, w.spec.Labels) {
			t.Errorf("Service %s does not select its pods", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if port(w.spec.Spec.Containers[0], p.TargetPort.String()) == 0 {
				t.Errorf("Service %s port %s targets %s, which the container does not declare", s.Name, p.Name, p.TargetPort.String())
			}
		}
		for _, e := range w.spec.Spec.Containers[0].Env {
			if !strings.HasSuffix(e.Name, "_ADDR") || e.Name == "TETHER_GRPC_ADDR" || e.Name == "TETHER_METRICS_ADDR" ||
				e.Name == "TETHER_ADVERTISE_ADDR" || e.Name == "TETHER_RUNNER_ADDR" {
				continue
			}
			host, p, err := net.SplitHostPort(e.Value)
			if err != nil {
				t.Errorf("%s: %s=%q: %v", w.name, e.Name, e.Value, err)
				continue
			}
			// <pod>.<service>: one pod of a StatefulSet behind its headless
			// Service.
			if pod, service, ok := strings.Cut(host, "."); ok {
				if !statefulPod(o, pod, service) {
					t.Errorf("%s: %s=%s names no pod of a StatefulSet behind a headless Service", w.name, e.Name, e.Value)
					continue
				}
				host = service
			}
			target, ok := svc[host]
			if !ok || !slices.ContainsFunc(target.Spec.Ports, func(sp corev1.ServicePort) bool { return strconv.Itoa(int(sp.Port)) == p }) {
				t.Errorf("%s: %s=%s names no Service port", w.name, e.Name, e.Value)
				continue
			}
			checkPolicyAdmits(t, o, w.spec.Labels, byName[host], p)
		}
	}
	var denyAll bool
	for _, p := range o.policies {
		denyAll = denyAll || len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 && len(p.Spec.Ingress) == 0 && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
	}
	if !denyAll {
		t.Error("no default-deny ingress NetworkPolicy")
	}
	// The gateway admits only executors on its gRPC port (docs/security.md).
	for _, p := range o.policies {
		if !selects(&p.Spec.PodSelector, byName["runnergw"].spec.Labels) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			if slices.ContainsFunc(r.Ports, func(np networkingv1.NetworkPolicyPort) bool { return np.Port != nil && np.Port.IntValue() == 7401 }) &&
				(len(r.From) == 0 || slices.ContainsFunc(r.From, func(f networkingv1.NetworkPolicyPeer) bool { return !selects(f.PodSelector, ex.spec.Labels) })) {
				t.Errorf("NetworkPolicy %s admits non-executors to the gateway's gRPC port", p.Name)
			}
		}
	}
}

// statefulPod reports whether pod is the name of a pod of a StatefulSet
// whose serviceName is service, a headless Service.
func statefulPod(o *objects, pod, service string) bool {
	headless := slices.ContainsFunc(o.services, func(s *corev1.Service) bool {
		return s.Name == service && s.Spec.ClusterIP == corev1.ClusterIPNone
	})
	for _, ss := range o.statefulSets {
		i := strings.LastIndexByte(pod, '-')
		if ss.Spec.ServiceName != service || i < 0 {
			continue
		}
		prefix, ord := pod[:i], pod[i+1:]
		if n, err := strconv.Atoi(ord); err == nil && prefix == ss.Name && n < int(ptrOr(ss.Spec.Replicas, 1)) {
			return headless
		}
	}
	return false
}

// checkPolicyAdmits: some NetworkPolicy selecting the target's pods admits
// the caller's pods on port.
func checkPolicyAdmits(t *testing.T, o *objects, caller map[string]string, target workload, port string) {
	t.Helper()
	for _, p := range o.policies {
		if !selects(&p.Spec.PodSelector, target.spec.Labels) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			portOK := slices.ContainsFunc(r.Ports, func(np networkingv1.NetworkPolicyPort) bool { return np.Port != nil && np.Port.String() == port })
			fromOK := len(r.From) == 0 || slices.ContainsFunc(r.From, func(f networkingv1.NetworkPolicyPeer) bool { return selects(f.PodSelector, caller) })
			if portOK && fromOK {
				return
			}
		}
	}
	t.Errorf("no NetworkPolicy admits %v to %s port %s", caller, target.name, port)
}

func covered[T any](xs []T, labels map[string]string, sel func(T) (*metav1.LabelSelector, bool)) bool {
	for _, x := range xs {
		if s, ok := sel(x); ok && selects(s, labels) {
			return true
		}
	}
	return false
}

// selects reports whether a (matchLabels-only) selector selects labels.
func selects(s *metav1.LabelSelector, labels map[string]string) bool {
	if s == nil || len(s.MatchExpressions) > 0 {
		return false
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestD2_EveryManifestIsInTheKustomization: a YAML file here that the
// kustomization does not list would never be applied.
func TestD2_EveryManifestIsInTheKustomization(t *testing.T) {
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("*.yaml")
	for _, f := range files {
		if f != "kustomization.yaml" && !slices.Contains(k.Resources, f) {
			t.Errorf("%s is not listed in kustomization.yaml resources", f)
		}
	}
}

// TestL3_TheSchemaIsMigratedByAJobBeforeTheExecutorsStart: the executors do
// not migrate (TETHER_MIGRATE=false, so a rolling upgrade never has two
// releases racing to migrate from their pods); a Job runs `executor
// migrate` with the database URL from its Secret; each executor pod waits
// in an init container until `executor migrate -check` passes. The check
// is a real flag of the binary.
func TestL3_TheSchemaIsMigratedByAJobBeforeTheExecutorsStart(t *testing.T) {
	o := render(t)
	var job *batchv1.Job
	for _, j := range o.jobs {
		if j.Name == "executor-migrate" {
			job = j
		}
	}
	if job == nil {
		t.Fatal("no Job executor-migrate")
	}
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 || !slices.Equal(pod.Containers[0].Command, []string{"executor", "migrate"}) {
		t.Fatalf("the Job must run `executor migrate`: %+v", pod.Containers)
	}
	if pod.RestartPolicy != corev1.RestartPolicyOnFailure && pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("Job restartPolicy %q", pod.RestartPolicy)
	}
	dbFromSecret := func(c corev1.Container) bool {
		for _, e := range c.Env {
			if e.Name == "TETHER_DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "tether-database" {
				return true
			}
		}
		return false
	}
	if !dbFromSecret(pod.Containers[0]) {
		t.Error("the Job's TETHER_DATABASE_URL must come from the tether-database Secret")
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the Job must run as non-root")
	}
	for _, w := range o.workloads() {
		if w.name != "executor" {
			continue
		}
		if v, _ := envValue(w.spec.Spec.Containers[0], "TETHER_MIGRATE"); v != "false" {
			t.Errorf("executor: TETHER_MIGRATE=%q, want false (the Job migrates)", v)
		}
		var waits bool
		for _, c := range w.spec.Spec.InitContainers {
			waits = waits || strings.Contains(strings.Join(c.Command, " "), "executor migrate -check") && dbFromSecret(c)
		}
		if !waits {
			t.Error("executor: no init container waiting on `executor migrate -check`")
		}
	}
	// -check is a flag of `executor migrate`.
	flagsOf(t, "executor")
	out, _ := exec.Command(filepath.Join(binDir, "executor"), "migrate", "-h").CombinedOutput()
	if !strings.Contains(string(out), "-check") {
		t.Errorf("executor migrate -h lists no -check:\n%s", out)
	}
}

// TestT7_TheGatewayPodConfinesItsProvidersWithBubblewrap: the runner
// gateway runs its providers in a bubblewrap sandbox by default (SPEC T7):
// TETHER_RUNNER_CONFINEMENT=bwrap, with what bwrap needs in an
// unprivileged pod — a user namespace of the pod's own (hostUsers: false),
// a seccomp profile that allows creating user namespaces, an unmasked
// /proc — and the image installs bubblewrap. Without them the gateway
// refuses to start rather than run providers unconfined. (No kubelet here:
// the sandbox itself is tested on a host by TestT7_… in the e2e suite.)
func TestT7_TheGatewayPodConfinesItsProvidersWithBubblewrap(t *testing.T) {
	o := render(t)
	var gw *workload
	for _, w := range o.workloads() {
		if w.name == "runnergw" {
			gw = &w
		}
	}
	if gw == nil {
		t.Fatal("no runnergw workload")
	}
	c := gw.spec.Spec.Containers[0]
	if v, _ := envValue(c, "TETHER_RUNNER_CONFINEMENT"); v != "bwrap" {
		t.Errorf("runnergw: TETHER_RUNNER_CONFINEMENT=%q, want bwrap", v)
	}
	if hu := gw.spec.Spec.HostUsers; hu == nil || *hu {
		t.Error("runnergw: the pod must run in its own user namespace (hostUsers: false)")
	}
	sc := c.SecurityContext
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("runnergw: RuntimeDefault seccomp refuses bubblewrap's user namespace; the container needs Unconfined or a Localhost profile")
	}
	if sc == nil || sc.ProcMount == nil || *sc.ProcMount != corev1.UnmaskedProcMount {
		t.Error("runnergw: bubblewrap mounts its own /proc: procMount Unmasked")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("runnergw: no privilege escalation")
	}
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "bubblewrap") {
		t.Error("deploy/Dockerfile does not install bubblewrap")
	}
}
