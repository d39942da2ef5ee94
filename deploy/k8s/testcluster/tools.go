//go:build tools

// Package testcluster pins the Kubernetes API server and etcd that
// `make test-k8s` builds from their Go modules (deploy/k8s/test.sh) to
// validate the manifests against a real API server, offline. It is a
// module of its own so that the product's modules never depend on them.
package testcluster

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
