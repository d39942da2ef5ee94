#!/usr/bin/env bash
# make image (SPEC L4): the service image, built reproducibly from the static
# binaries without Docker Hub and without a Docker daemon.
#
# The image is a docker-archive (docker load -i) with two layers:
#   1. the base: a Debian rootfs tarball (BASE_ROOTFS; by default
#      .cache/image/base-rootfs.tar, made once with debootstrap — minbase with
#      ca-certificates and bubblewrap, as make test-compose's base — and kept:
#      the same file is the same input next time);
#   2. tether: the static binaries in /usr/local/bin and /var/lib/tether
#      (uid 10001), written as a tar with sorted names, every time set to
#      SOURCE_DATE_EPOCH and numeric root ownership.
# The config's created time is SOURCE_DATE_EPOCH (default: the commit time of
# HEAD) and its labels name the version and the commit
# (org.opencontainers.image.version, .revision, .created, .source). Given the
# same base, source tree and Go toolchain, two builds give byte-identical
# archives, hence the same image id (the sha256 of the config), printed last.
# The binaries run as uid 10001 (deploy/k8s's runAsUser); the image names
# no user account.
#
# Environment: VERSION, SOURCE_DATE_EPOCH, BASE_ROOTFS, OUT (default
# bin/tether-image.tar), IMAGE_CMDS (the packages to build), IMAGE_TAG
# (default tether:$VERSION), LOAD=1 also runs docker load.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
die() { echo "make image: $*" >&2; exit 1; }

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
OUT=${OUT:-$repo/bin/tether-image.tar}
IMAGE_TAG=${IMAGE_TAG:-tether:${VERSION}}
IMAGE_CMDS=${IMAGE_CMDS:-./services/executor/cmd/executor ./services/executor/cmd/tetherctl ./services/runnergw/cmd/runnergw ./services/backup/cmd/backup-verifier ./services/runnerd/cmd/runnerd ./services/runnerd/tools/fake-codex-app-server}
BASE_ROOTFS=${BASE_ROOTFS:-$repo/.cache/image/base-rootfs.tar}

if [ ! -f "$BASE_ROOTFS" ]; then
	[ "$(id -u)" = 0 ] || die "no $BASE_ROOTFS: building it with debootstrap needs root (or set BASE_ROOTFS to a rootfs tarball)"
	command -v debootstrap >/dev/null || die "no $BASE_ROOTFS and no debootstrap (apt-get install debootstrap, or set BASE_ROOTFS)"
	mkdir -p "$(dirname "$BASE_ROOTFS")"
	rootfs=$(mktemp -d)
	echo "make image: building the base rootfs with debootstrap (once; kept in $BASE_ROOTFS)"
	debootstrap --variant=minbase --include=ca-certificates,bubblewrap bookworm "$rootfs" http://deb.debian.org/debian \
		>"$(dirname "$BASE_ROOTFS")/debootstrap.log" 2>&1 || die "debootstrap failed: $(dirname "$BASE_ROOTFS")/debootstrap.log"
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
	tar -C "$rootfs" --sort=name --numeric-owner -cf "$BASE_ROOTFS.tmp" . && mv "$BASE_ROOTFS.tmp" "$BASE_ROOTFS"
	rm -rf "$rootfs"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Deterministic tar: names sorted, one mtime, numeric root ownership, no
# access or change times.
dtar() {
	tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=pax \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}

# --- layer 2: the static binaries ---------------------------------------------
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/var/lib/tether"
# shellcheck disable=SC2086
CGO_ENABLED=0 go build -trimpath -buildvcs="$(git rev-parse --is-inside-work-tree >/dev/null 2>&1 && echo true || echo false)" \
	-ldflags "-s -w -X github.com/tether-run/tether/pkg/buildinfo.version=$VERSION" -o "$root/usr/local/bin/" $IMAGE_CMDS
chmod 0755 "$root/usr/local/bin"/* "$root/usr" "$root/usr/local" "$root/usr/local/bin" "$root/var" "$root/var/lib"
chmod 0750 "$root/var/lib/tether"
# One layer, two parts: usr/ as root, var/lib/tether as uid 10001 (the
# parts' tars concatenated: each entry keeps the header it was written with).
(cd "$root" && dtar -cf "$work/layer.tar" usr)
(cd "$root" && tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=10001 --group=10001 --numeric-owner --format=pax \
	--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$work/home.tar" var/lib/tether)
tar -Af "$work/layer.tar" "$work/home.tar"

sha() { sha256sum "$1" | cut -d' ' -f1; }
base_id=$(sha "$BASE_ROOTFS")
layer_id=$(sha "$work/layer.tar")
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# --- config and manifest --------------------------------------------------------
cat >"$work/config.json" <<EOF
{"architecture":"amd64","os":"linux","created":"$created","config":{"User":"10001:10001","WorkingDir":"/var/lib/tether","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","HOME=/var/lib/tether"],"Cmd":["executor","-h"],"Labels":{"org.opencontainers.image.created":"$created","org.opencontainers.image.revision":"$REVISION","org.opencontainers.image.source":"https://github.com/tether-run/tether","org.opencontainers.image.title":"tether","org.opencontainers.image.version":"$VERSION"}},"rootfs":{"type":"layers","diff_ids":["sha256:$base_id","sha256:$layer_id"]},"history":[{"created":"$created","created_by":"base rootfs $(basename "$BASE_ROOTFS")"},{"created":"$created","created_by":"make image: static binaries $VERSION"}]}
EOF
config_id=$(sha "$work/config.json")
img=$work/image
mkdir -p "$img"
cp "$work/config.json" "$img/$config_id.json"
mkdir -p "$img/$base_id" "$img/$layer_id"
ln "$BASE_ROOTFS" "$img/$base_id/layer.tar" 2>/dev/null || cp "$BASE_ROOTFS" "$img/$base_id/layer.tar"
cp "$work/layer.tar" "$img/$layer_id/layer.tar"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar","%s/layer.tar"]}]\n' \
	"$config_id" "$IMAGE_TAG" "$base_id" "$layer_id" >"$img/manifest.json"
mkdir -p "$(dirname "$OUT")"
(cd "$img" && dtar -cf "$OUT.tmp" --hard-dereference .) && mv "$OUT.tmp" "$OUT"
echo "make image: $OUT ($IMAGE_TAG, version $VERSION, revision $REVISION, created $created)"
if [ "${LOAD:-}" = 1 ]; then
	docker load -i "$OUT"
fi
echo "image id: sha256:$config_id"
