#!/usr/bin/env bash
# make test-k8s (SPEC D4): the kustomization in deploy/k8s against a real
# Kubernetes API server, offline.
#
#  1. kube-apiserver and etcd, built once from their Go modules (versions
#     pinned in deploy/k8s/testcluster/go.mod) into .cache/k8s/bin;
#  2. a private etcd and API server on loopback (a bearer token in
#     system:masters, RBAC, a self-signed serving certificate);
#  3. the manifest tests of deploy/k8s with TETHER_K8S_SERVER set: every
#     object server-side applied as a dry run, then for real, read back;
#     a broken StatefulSet refused; then the static checks (strict
#     decoding, flags, probes, topology, fleet, egress, secrets).
# No kubelet or container runtime runs: the objects are validated and
# stored, no pod is scheduled.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
k8s_version=$(sed -n 's/^\tk8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' deploy/k8s/testcluster/go.mod)
etcd_version=$(sed -n 's/^\tgo.etcd.io\/etcd\/server\/v3 \(v[0-9.]*\)$/\1/p' deploy/k8s/testcluster/go.mod)
cache=$repo/.cache/k8s
mkdir -p "$cache/bin"

log() { printf 'test-k8s: %s\n' "$*"; }
die() { printf 'test-k8s: FAIL: %s\n' "$*" >&2; exit 1; }

build() { # name package
	local name=$1 pkg=$2
	if [ -x "$cache/bin/$name" ]; then
		return
	fi
	log "building $name from its Go module into $cache/bin (once; 10-20 minutes on 2 cores)"
	(cd deploy/k8s/testcluster && GOWORK=off GOFLAGS=-mod=mod go build -trimpath -o "$cache/bin/$name.tmp" "$pkg")
	mv "$cache/bin/$name.tmp" "$cache/bin/$name"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver

for tool in openssl curl; do
	command -v $tool >/dev/null || die "$tool is needed"
done

tmp=$(mktemp -d)
pids=()
cleanup() {
	local rc=$?
	# The API server first (it would wait for etcd while shutting down),
	# each given 10 s, then killed.
	local i p
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		p=${pids[$i]}
		kill "$p" 2>/dev/null || continue
		for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$p" 2>/dev/null || true
	done
	if [ $rc != 0 ]; then
		for f in "$tmp"/*.log; do [ -f "$f" ] && { log "tail of $(basename "$f"):"; tail -20 "$f" >&2; }; done
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# Free loopback ports (below the ephemeral range, checked unused).
port() {
	local p
	while :; do
		p=$(shuf -i 20000-29999 -n 1)
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}
etcd_port=$(port)
peer_port=$(port)
api_port=$(port)

log "etcd $etcd_version on 127.0.0.1:$etcd_port"
"$cache/bin/etcd" --name test --data-dir "$tmp/etcd" --log-level warn \
	--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
	--listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
	--initial-cluster "test=http://127.0.0.1:$peer_port" >"$tmp/etcd.log" 2>&1 &
pids+=($!)

openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
openssl rsa -in "$tmp/sa.key" -pubout -out "$tmp/sa.pub" 2>/dev/null
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,system:masters" >"$tmp/tokens.csv"

log "kube-apiserver $k8s_version on 127.0.0.1:$api_port (etcd $etcd_version)"
"$cache/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$tmp/certs" \
	--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$tmp/sa.pub" \
	--service-account-signing-key-file "$tmp/sa.key" --token-auth-file "$tmp/tokens.csv" \
	--authorization-mode RBAC --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
	--disable-admission-plugins ServiceAccount >"$tmp/apiserver.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 240); do
	if curl -sf --cacert "$tmp/certs/apiserver.crt" -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port/readyz" >/dev/null 2>&1; then
		ready=1
		break
	fi
	kill -0 "${pids[1]}" 2>/dev/null || die "kube-apiserver exited"
	sleep 0.5
done
[ "${ready:-}" = 1 ] || die "kube-apiserver not ready after 120 s"
log "API server ready; applying the kustomization (dry run, then for real) and running the manifest tests"

(cd deploy/k8s && TETHER_K8S_SERVER="https://127.0.0.1:$api_port" TETHER_K8S_TOKEN="$token" \
	TETHER_K8S_CA="$tmp/certs/apiserver.crt" GOWORK=off go test -count=1 -v ./ 2>&1) | tee "$tmp/test.out" |
	grep -E '^(=== RUN|--- |PASS|FAIL|ok)|validated|refused' || true
grep -q '^--- PASS: TestD4_TheKustomizationIsAcceptedByARealAPIServer' "$tmp/test.out" || die "the API server test did not pass"
grep -q '^ok' "$tmp/test.out" || die "manifest tests failed"
log "PASS: a real kube-apiserver ($k8s_version) over etcd ($etcd_version) validated, admitted and stored every object of deploy/k8s; the static manifest checks passed too. Not done here: no kubelet or container runtime runs, so no pod was scheduled or started."
