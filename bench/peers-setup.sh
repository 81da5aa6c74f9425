#!/usr/bin/env bash
# Installs and prepares the peers that `mayfly-bench` measures Mayfly against:
# bubblewrap, runc (with an OCI bundle) and podman (with an imported image), and
# the gateway measure's load tool, server and peer proxies (wrk, nginx, HAProxy).
#
#   bash bench/peers-setup.sh [PEERS_DIR]        # default /var/lib/mayfly-bench
#
# Idempotent: re-running rebuilds the bundle and re-imports the image.
# Needs root and Debian's package mirror. See docs/BENCHMARKS.md.
set -euo pipefail

PEERS_DIR=${1:-${MAYFLY_BENCH_PEERS:-/var/lib/mayfly-bench}}
IMAGE=localhost/mayfly-bench-busybox:latest

if [ "$(id -u)" -ne 0 ]; then
    echo "peers-setup.sh: run as root (runc and podman are measured as root)" >&2
    exit 1
fi

need=()
for cmd in bwrap:bubblewrap runc:runc podman:podman jq:jq unshare:util-linux wrk:wrk \
    /usr/sbin/nginx:nginx-light /usr/sbin/haproxy:haproxy; do
    command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd#*:}")
done
# busybox-static, not the dynamic busybox: the rootfs below has no libc.
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
BUSYBOX=/bin/busybox

# One busybox rootfs, shared by the runc bundle and the podman image, so both
# peers start the same /bin/true.
rootfs_build() {
    local root=$1
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc,root}
    cp "$BUSYBOX" "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
    echo 'root:x:0:' >"$root/etc/group"
}

BUNDLE=$PEERS_DIR/runc-bundle
mkdir -p "$PEERS_DIR"
rootfs_build "$BUNDLE/rootfs"

# `runc spec` writes the default config: pid, network, ipc, uts, mount and
# cgroup namespaces, a read-only root, masked /proc paths. We only make it
# non-interactive and run /bin/true; the network namespace stays (loopback
# only), matching what Mayfly and `bwrap --unshare-all` do.
rm -f "$BUNDLE/config.json"
(cd "$BUNDLE" && runc spec)
jq '.process.terminal = false
    | .process.args = ["/bin/true"]
    | .hostname = "mayfly-bench"
    | .linux.namespaces |= (map(.type) as $t
        | . + ([{type: "network"}, {type: "ipc"}, {type: "uts"}, {type: "pid"}, {type: "mount"}]
               | map(select(.type as $x | $t | index($x) | not))))' \
    "$BUNDLE/config.json" >"$BUNDLE/config.json.new"
mv "$BUNDLE/config.json.new" "$BUNDLE/config.json"

# The podman image: the same rootfs, imported as a single layer.
podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
tar -C "$BUNDLE/rootfs" -c . | podman import --quiet - "$IMAGE" >/dev/null

# Smoke-test each peer once, so a broken set-up fails here and not mid-run.
bwrap --ro-bind / / --unshare-all --die-with-parent --dev /dev --proc /proc /bin/true
unshare -U -m -p -n -i -u --fork /bin/true
runc run -b "$BUNDLE" "mayfly-bench-setup-$$"
podman --runtime runc run --rm --network none \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$IMAGE" /bin/true

cat >"$PEERS_DIR/peers.env" <<EOF
MAYFLY_BENCH_BUNDLE=$BUNDLE
MAYFLY_BENCH_IMAGE=$IMAGE
EOF
echo "peers ready in $PEERS_DIR:"
echo "  bwrap $(bwrap --version | awk '{print $2}'), runc $(runc --version | awk 'NR==1{print $3}'), podman $(podman --version | awk '{print $3}')"
echo "  runc bundle: $BUNDLE"
echo "  podman image: $IMAGE"
