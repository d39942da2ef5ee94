// Package k8s holds the test that validates tether's Kubernetes manifests
// (the YAML beside it, built with kustomize). It is its own module so that
// the Kubernetes API types do not weigh on the services' builds.
package k8s
