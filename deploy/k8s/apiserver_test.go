package k8s

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// apiServer connects to the API server `make test-k8s` started
// (TETHER_K8S_SERVER, TETHER_K8S_TOKEN); the test is skipped without one.
func apiServer(t *testing.T) (dynamic.Interface, meta.RESTMapper) {
	t.Helper()
	host := os.Getenv("TETHER_K8S_SERVER")
	if host == "" {
		t.Skip("no API server: run make test-k8s")
	}
	cfg := &rest.Config{Host: host, BearerToken: os.Getenv("TETHER_K8S_TOKEN"),
		TLSClientConfig: rest.TLSClientConfig{CAFile: os.Getenv("TETHER_K8S_CA")}, Timeout: 30 * time.Second}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

// renderUnstructured builds the kustomization into API objects as kubectl
// would send them, the Namespace first.
func renderUnstructured(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatal(err)
		}
		if u.GetKind() == "Namespace" {
			out = append([]*unstructured.Unstructured{u}, out...)
		} else {
			out = append(out, u)
		}
	}
	return out
}

// apply sends u as a server-side apply (dry run: validated, admitted and
// defaulted by the server, not stored).
func apply(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, u *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := u.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "tether-test-k8s", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return ri.Apply(ctx, u.GetName(), u, opts)
}

// TestD4_TheKustomizationIsAcceptedByARealAPIServer (make test-k8s): a
// real kube-apiserver (over a real etcd) takes every object of the
// kustomization — first as a server-side dry run, then for real — so its
// validation (required fields, selectors matching their templates,
// immutable shapes, enum values, quantities) and its admission checks
// have passed on each; every object then reads back as stored, the gateway
// Service headless. A StatefulSet whose selector misses its pod labels is
// refused by the same server, so the check can fail.
func TestD4_TheKustomizationIsAcceptedByARealAPIServer(t *testing.T) {
	dyn, mapper := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	objs := renderUnstructured(t)
	kinds := map[string]int{}
	for _, dry := range []bool{true, false} {
		for _, u := range objs {
			got, err := apply(ctx, dyn, mapper, u, dry)
			if err == nil && dry && u.GetKind() == "Namespace" {
				// A namespaced object is dry-run in an existing namespace:
				// the Namespace (rendered first) is created for real now.
				_, err = apply(ctx, dyn, mapper, u, false)
			}
			if err != nil {
				t.Fatalf("%s %s (dry run %v): the API server refused it: %v", u.GetKind(), u.GetName(), dry, err)
			}
			if !dry {
				kinds[u.GetKind()]++
				if got.GetUID() == "" {
					t.Errorf("%s %s: stored without a uid", u.GetKind(), u.GetName())
				}
			}
		}
	}
	var summary []string
	for k, n := range kinds {
		summary = append(summary, fmt.Sprintf("%d %s", n, k))
	}
	t.Logf("the API server validated and stored %d objects: %s", len(objs), strings.Join(summary, ", "))

	svc, err := dyn.Resource(mustMapping(t, mapper, "", "Service").Resource).Namespace("tether").Get(ctx, "runnergw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip, _, _ := unstructured.NestedString(svc.Object, "spec", "clusterIP"); ip != "None" {
		t.Errorf("Service runnergw stored with clusterIP %q, want None (headless)", ip)
	}

	// The server's own validation is what this test relies on: a broken
	// StatefulSet must be refused.
	for _, u := range objs {
		if u.GetKind() != "StatefulSet" || u.GetName() != "runnergw" {
			continue
		}
		bad := u.DeepCopy()
		bad.SetName("runnergw-broken")
		if err := unstructured.SetNestedStringMap(bad.Object, map[string]string{"app.kubernetes.io/name": "nothing"}, "spec", "selector", "matchLabels"); err != nil {
			t.Fatal(err)
		}
		_, err := apply(ctx, dyn, mapper, bad, true)
		if !apierrors.IsInvalid(err) {
			t.Fatalf("a StatefulSet whose selector misses its template's labels was not refused as invalid: %v", err)
		}
		t.Logf("as it must, the server refused a selector that misses its pods: %v", err)
	}
}

func mustMapping(t *testing.T, mapper meta.RESTMapper, group, kind string) *meta.RESTMapping {
	t.Helper()
	m, err := mapper.RESTMapping(schemaGroupKind(group, kind))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func schemaGroupKind(group, kind string) schema.GroupKind {
	return schema.GroupKind{Group: group, Kind: kind}
}
