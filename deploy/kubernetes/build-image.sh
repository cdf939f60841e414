#!/usr/bin/env bash
# Builds the ckptd container image offline, with podman, from a
# debootstrapped Debian tree (no registry, no base image pulled), and with
# --demo runs it: the README demo inside the image, then the two ways
# docs/KUBERNETES.md deploys it, as containers on this host.
#
# Usage: deploy/kubernetes/build-image.sh [--demo]
#
#   CKPT_BUILD_DIR      the build with daemon/ckptd, client/ckptctl and
#                       bench/ckpt-loadgen (default: build/, scripts/build.sh)
#   CKPT_IMAGE          the image's name (default localhost/ckptd:<git describe>)
#   CKPT_IMAGE_CACHE    where the debootstrapped base tree is kept
#                       (default <build>/image-tree-cache)
#   CKPT_DEBIAN_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
#   CKPT_PODMAN_RUNTIME the OCI runtime podman uses (default: podman's own;
#                       this project's build machine needs runc, see
#                       docs/KUBERNETES.md, "The image")
#
# The base tree is the host's Debian release (the binaries' shared
# libraries are that release's) with --variant=minbase and exactly the
# packages that own the libraries ldd names for the three binaries, the
# way tests/system/systemd_unit_test.sh builds its tree. The binaries are
# copied in with their debug info stripped, under /usr/local/bin as
# `cmake --install` puts them, with the shipped config at
# /usr/local/etc/ckptd/ckptd.conf (the image's default command uses it;
# the Kubernetes manifests mount their ConfigMap at /etc/ckptd instead).
# ckpt-loadgen is the demo's trainer.
#
# Needs root (debootstrap, podman's storage), podman and debootstrap
# (Debian packages), and the mirror for the first run (about 2 minutes).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${CKPT_BUILD_DIR:-$repo/build}" && pwd)
cache="${CKPT_IMAGE_CACHE:-$build/image-tree-cache}"
mirror="${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
image="${CKPT_IMAGE:-localhost/ckptd:$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)}"
podman=(podman)
[ -z "${CKPT_PODMAN_RUNTIME:-}" ] || podman+=(--runtime "$CKPT_PODMAN_RUNTIME")
demo=0
case "${1:-}" in
  --demo) demo=1 ;;
  "") ;;
  *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
esac

die() { echo "build-image.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and podman's storage)"
command -v podman >/dev/null || die "podman is not installed (Debian package podman)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian package debootstrap)"
binaries=("$build/daemon/ckptd" "$build/client/ckptctl" "$build/bench/ckpt-loadgen")
for b in "${binaries[@]}"; do
  [ -x "$b" ] || die "$b is missing: build first (scripts/build.sh)"
done
# shellcheck source=/dev/null
. /etc/os-release
suite="${VERSION_CODENAME:-}"
[ "${ID:-}" = debian ] && [ -n "$suite" ] ||
  die "the host is not Debian (${PRETTY_NAME:-unknown}); the base is its release"

# --- The packages the binaries need ------------------------------------------
# Each library ldd names, mapped to the Debian package that owns it (merged
# /usr: dpkg may know it under /lib or /usr/lib); one that no package owns
# is copied into the tree as it is.
packages=()
unowned=()
mapfile -t libs < <(for b in "${binaries[@]}"; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
candidates() { printf '%s\n' "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; }
# One dpkg query for all of them (each costs a read of dpkg's database).
declare -A owner_of=()
while IFS= read -r line; do
  case "$line" in diversion*) continue ;; esac
  pkg=${line%%: *}
  pkg=${pkg%%,*}
  owner_of[${line#*: }]=${pkg%%:*}
done < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u |
  xargs dpkg -S 2>/dev/null || true)
for lib in "${libs[@]}"; do
  owner=""
  while read -r path; do
    owner=${owner_of[$path]:-}
    [ -z "$owner" ] || break
  done < <(candidates "$lib")
  if [ -n "$owner" ]; then packages+=("$owner"); else unowned+=("$lib"); fi
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
stamp="suite=$suite mirror=$mirror packages=$(IFS=,; echo "${packages[*]}")"

# --- The base tree, cached ----------------------------------------------------
exec 9>"$cache.lock"
flock 9
if [ "$(cat "$cache/.ckpt-stamp" 2>/dev/null || true)" != "$stamp" ]; then
  echo "== debootstrap $suite (minbase + ${#packages[@]} packages) into $cache"
  rm -rf --one-file-system "$cache" "$cache.tmp"
  start=$SECONDS
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
      "$suite" "$cache.tmp" "$mirror" >"$cache.log" 2>&1; then
    tail -n 30 "$cache.log"
    rm -rf --one-file-system "$cache.tmp"
    die "debootstrap failed (log: $cache.log)"
  fi
  rm -rf "$cache.tmp/var/cache/apt/archives/"*.deb "$cache.tmp/var/lib/apt/lists/"*
  echo "$stamp" >"$cache.tmp/.ckpt-stamp"
  mv "$cache.tmp" "$cache"
  echo "debootstrap took $((SECONDS - start)) s"
fi

# --- The image's tree ---------------------------------------------------------
work=$(mktemp -d /tmp/ckptd-image-XXXXXX)
remove_containers() {  # the demo's, one by one (rm fails on a missing name)
  for name in ckptd-image-daemon ckptd-image-trainer; do
    "${podman[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true
  done
}
cleanup() {
  remove_containers
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
tree="$work/tree"
cp -a "$cache" "$tree"
exec 9>&-
rm -f "$tree/.ckpt-stamp"
rm -rf "$tree/usr/share/doc/"* "$tree/usr/share/man/"* "$tree/usr/share/locale/"*
for lib in "${unowned[@]}"; do
  echo "note: $lib belongs to no Debian package; copied into the image"
  mkdir -p "$tree$(dirname "$lib")"
  cp -L "$lib" "$tree$lib"
done
mkdir -p "$tree/usr/local/bin" "$tree/usr/local/etc/ckptd" "$tree/etc/ckptd" \
  "$tree/run/ckptd" "$tree/var/lib/ckptd"
for b in "${binaries[@]}"; do
  strip --strip-debug -o "$tree/usr/local/bin/$(basename "$b")" "$b"
done
install -m 0644 "$repo/deploy/ckptd.conf" "$tree/usr/local/etc/ckptd/ckptd.conf"

echo "== podman import -> $image"
tar -C "$tree" --numeric-owner -c . |
  "${podman[@]}" import \
    --change 'ENTRYPOINT ["/usr/local/bin/ckptd"]' \
    --change 'CMD ["--config", "/usr/local/etc/ckptd/ckptd.conf"]' \
    --change 'STOPSIGNAL SIGTERM' \
    --message "ckptd from $build" - "$image" >/dev/null
"${podman[@]}" image inspect --format '{{.Id}} {{.Size}}' "$image" |
  awk -v i="$image" '{printf "%s: %s, %.0f MiB\n", i, substr($1, 1, 12), $2 / 1048576}'
[ "$demo" -eq 1 ] || exit 0

# --- The demo, as containers ----------------------------------------------------
# podman's default rlimits (nofile 1048576, nproc 4194304) are above what
# a process without CAP_SYS_RESOURCE may set where the host's hard limits
# are lower, and the runtime then fails to start the container ("error
# setting rlimits ... operation not permitted"). Ask for the host's open
# files, and for 4096 processes per uid (threads count: the demo's daemon
# and ranks need a few hundred), under the hard limit podman's runtime
# process inherits (32768 on this project's build machine, lower than the
# shell's).
ulimits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
# The DaemonSet's container: root with only the three capabilities, no new
# privileges, read-only image (deploy/kubernetes/ckptd-daemonset.yaml);
# --read-only-tmpfs=false: Kubernetes' readOnlyRootFilesystem mounts no
# tmpfs on /tmp, /run and /var/tmp as podman's --read-only does.
daemonset_security=(--cap-drop=all --cap-add=SYS_PTRACE,CHOWN,DAC_OVERRIDE
  --security-opt=no-new-privileges --read-only --read-only-tmpfs=false)
loadgen=(/usr/local/bin/ckpt-loadgen --job demo --ranks 4 --tensors 200
  --bytes-per-rank $((64 << 20)) --saves 2 --restore)
wait_ready() {  # CONTAINER SOCKET: until ckptctl status answers in it (30 s)
  for _ in $(seq 300); do
    "${podman[@]}" exec "$1" /usr/local/bin/ckptctl --socket "$2" status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  "${podman[@]}" logs "$1" >&2 || true
  die "ckptd in $1 did not answer on $2 within 30 s"
}

remove_containers  # a killed earlier run's
echo "== 1. the README demo inside the image (one container, DaemonSet's privileges)"
mkdir -p "$work/demo"
"${podman[@]}" run --rm "${ulimits[@]}" "${daemonset_security[@]}" \
  -v "$work/demo:/demo" --entrypoint /bin/sh "$image" -ec '
    /usr/local/bin/ckptd --socket /demo/ckptd.sock --root /demo/checkpoints \
      >/demo/ckptd.log 2>&1 &
    daemon=$!
    i=0; until /usr/local/bin/ckptctl --socket /demo/ckptd.sock status >/dev/null 2>&1; do
      i=$((i + 1)); [ $i -lt 100 ] || { cat /demo/ckptd.log; exit 1; }; sleep 0.1; done
    echo "-- 4 trainer ranks x 64 MiB, 2 saves, then restore and verify"
    '"${loadgen[*]}"' --socket /demo/ckptd.sock
    echo "-- ckptctl list"; /usr/local/bin/ckptctl --socket /demo/ckptd.sock list
    echo "-- ckptctl status"; /usr/local/bin/ckptctl --socket /demo/ckptd.sock status
    kill -TERM $daemon; wait $daemon
    echo "-- the daemon log (pool pinning, I/O backend, drain)"
    grep -E "mlock|unpinned|io_uring|pread|drain|open-files" /demo/ckptd.log || true'

echo "== 2. DaemonSet layout: the ConfigMap's config, daemon in the host PID namespace, trainer as training-pod.yaml runs it"
# The DaemonSet's volumes: the node's socket directory and storage root,
# the ConfigMap's ckptd.conf (taken from ckptd-config.yaml as the kubelet
# would write it), the Secret's file, the metrics emptyDir; and its args.
mkdir -p "$work/ds/run" "$work/ds/root" "$work/ds/config" "$work/ds/s3" "$work/ds/metrics"
awk '/^  ckptd\.conf: \|/ {f = 1; next}
     f && /^    / {print substr($0, 5); next}
     f && /^ *$/ {print ""; next}
     f {exit}' "$here/ckptd-config.yaml" >"$work/ds/config/ckptd.conf"
grep -q '^socket: "/run/ckptd/ckptd.sock"' "$work/ds/config/ckptd.conf" ||
  die "could not read ckptd.conf out of ckptd-config.yaml"
awk '/^  credentials: \|/ {f = 1; next} f && /^    / {print substr($0, 5); next} f {exit}' \
  "$here/ckptd-remote-credentials.yaml" >"$work/ds/s3/credentials"
chmod 0400 "$work/ds/s3/credentials"
ds_volumes=(-v "$work/ds/run:/run/ckptd" -v "$work/ds/root:/var/lib/ckptd"
  -v "$work/ds/config:/etc/ckptd:ro" -v "$work/ds/s3:/etc/ckptd-s3:ro"
  -v "$work/ds/metrics:/var/lib/ckptd-metrics")
ds_args=(--config=/etc/ckptd/ckptd.conf --remote_credentials_file=/etc/ckptd-s3/credentials)
"${podman[@]}" run -d --name ckptd-image-daemon "${ulimits[@]}" "${daemonset_security[@]}" \
  --pid=host --network=none "${ds_volumes[@]}" "$image" "${ds_args[@]}" >/dev/null
wait_ready ckptd-image-daemon /run/ckptd/ckptd.sock
# The trainer: its own PID namespace, uid 1000 in the socket group 2000,
# no capabilities (training-pod.yaml); it sees the daemon only through the
# socket directory.
"${podman[@]}" run --rm --name ckptd-image-trainer "${ulimits[@]}" --network=none \
  --user 1000:1000 --group-add 2000 --cap-drop=all --security-opt=no-new-privileges \
  -v "$work/ds/run:/run/ckptd" -e CKPTD_SOCKET=/run/ckptd/ckptd.sock \
  --entrypoint "${loadgen[0]}" "$image" "${loadgen[@]:1}" --socket /run/ckptd/ckptd.sock
"${podman[@]}" exec ckptd-image-daemon /usr/local/bin/ckptctl list demo
echo "socket: $(stat -c '%a %g' "$work/ds/run/ckptd.sock" | sed 's/ / group /');" \
  "job directory: $(stat -c '%a uid %u' "$work/ds/root/demo")"
[ "$(stat -c '%u %a' "$work/ds/root/demo")" = "1000 700" ] ||
  die "the job directory is not the trainer's uid's, mode 0700"
# SIGTERM; the daemon writes its metrics file once more as it stops.
"${podman[@]}" rm -f -t 30 ckptd-image-daemon >/dev/null
committed=$(awk '$1 == "ckptd_saves_total{outcome=\"committed\"}" {print $2}' \
  "$work/ds/metrics/ckptd.prom")
echo "metrics file (what the metrics container serves): $(grep -c '^ckptd_' \
  "$work/ds/metrics/ckptd.prom") samples, ckptd_saves_total{outcome=\"committed\"} $committed"
[ "$committed" = 8 ] || die "the metrics file counts ${committed:-no} committed saves, not 4 ranks x 2"

echo "== 2a. the drain: a save still being written when the container is stopped commits"
# Writes capped at 16 MiB/s: the trainer's 128 MiB save is STAGED at once
# (the pool holds it) and the trainer exits; the daemon is still writing
# when `podman stop` sends SIGTERM, as the kubelet does, with the
# DaemonSet's 90 s before SIGKILL.
"${podman[@]}" run -d --name ckptd-image-daemon "${ulimits[@]}" "${daemonset_security[@]}" \
  --pid=host --network=none "${ds_volumes[@]}" "$image" "${ds_args[@]}" \
  --write_rate_limit $((16 << 20)) >/dev/null
wait_ready ckptd-image-daemon /run/ckptd/ckptd.sock
"${podman[@]}" run --rm "${ulimits[@]}" --network=none -v "$work/ds/run:/run/ckptd" \
  --entrypoint /usr/local/bin/ckpt-loadgen "$image" --socket /run/ckptd/ckptd.sock \
  --job drain --ranks 1 --tensors 8 --bytes-per-rank $((128 << 20)) --saves 1 \
  --exit-after-staged >/dev/null
"${podman[@]}" exec ckptd-image-daemon /usr/local/bin/ckptctl status | sed -n 2p
start=$SECONDS
"${podman[@]}" stop -t 90 ckptd-image-daemon >/dev/null
echo "stopped after $((SECONDS - start)) s; the daemon's log:"
"${podman[@]}" logs ckptd-image-daemon 2>&1 | grep -E "signal|drain:" || true
"${podman[@]}" rm ckptd-image-daemon >/dev/null
# A new daemon on the same root finds the checkpoint committed and intact.
"${podman[@]}" run -d --name ckptd-image-daemon "${ulimits[@]}" "${daemonset_security[@]}" \
  --pid=host --network=none "${ds_volumes[@]}" "$image" "${ds_args[@]}" >/dev/null
wait_ready ckptd-image-daemon /run/ckptd/ckptd.sock
"${podman[@]}" exec ckptd-image-daemon /usr/local/bin/ckptctl list drain | tee "$work/drain.list"
grep -q " committed " "$work/drain.list" || die "the save in flight at the stop did not commit"
"${podman[@]}" exec ckptd-image-daemon /usr/local/bin/ckptctl verify drain
"${podman[@]}" rm -f -t 30 ckptd-image-daemon >/dev/null

echo "== 2b. the same without CAP_SYS_PTRACE: the save of a root trainer must fail"
# Even at the same uid: a trainer with the runtime's default capabilities
# has some the daemon lacks, and only CAP_SYS_PTRACE passes that check.
"${podman[@]}" run -d --name ckptd-image-daemon "${ulimits[@]}" --cap-drop=all \
  --cap-add=CHOWN,DAC_OVERRIDE --security-opt=no-new-privileges --read-only --read-only-tmpfs=false \
  --pid=host --network=none "${ds_volumes[@]}" "$image" "${ds_args[@]}" >/dev/null
wait_ready ckptd-image-daemon /run/ckptd/ckptd.sock
if "${podman[@]}" run --rm "${ulimits[@]}" --network=none -v "$work/ds/run:/run/ckptd" \
    --entrypoint /usr/local/bin/ckpt-loadgen "$image" --socket /run/ckptd/ckptd.sock \
    --job denied --ranks 1 --tensors 4 --bytes-per-rank $((1 << 20)) --saves 1 \
    >"$work/denied.log" 2>&1; then
  cat "$work/denied.log"
  die "a save worked without CAP_SYS_PTRACE: the capability list is wrong"
fi
echo "refused as expected: $(grep -m 1 -iE "denied|not permitted|error|fail" "$work/denied.log" || tail -n 1 "$work/denied.log")"
"${podman[@]}" rm -f -t 0 ckptd-image-daemon >/dev/null

echo "== 3. sidecar layout: one PID namespace for both containers, both uid 1000, no capabilities"
# shareProcessNamespace: the trainer joins the daemon's PID namespace
# (Kubernetes puts the pod's pause process there too).
mkdir -p "$work/pod/root" "$work/pod/run" && chown 1000:1000 "$work/pod/root" "$work/pod/run"
sidecar_security=(--user 1000:1000 --cap-drop=all --security-opt=no-new-privileges --read-only
  --read-only-tmpfs=false)
"${podman[@]}" run -d --name ckptd-image-daemon "${ulimits[@]}" "${sidecar_security[@]}" \
  --network=none -v "$work/pod/run:/run/ckptd" -v "$work/pod/root:/ckpt" "$image" \
  --config /usr/local/etc/ckptd/ckptd.conf --socket /run/ckptd/ckptd.sock --root /ckpt >/dev/null
wait_ready ckptd-image-daemon /run/ckptd/ckptd.sock
# The socket directory is the pod's emptyDir in Kubernetes: a directory
# both containers mount here.
"${podman[@]}" run --rm --pid container:ckptd-image-daemon --network=none "${ulimits[@]}" \
  "${sidecar_security[@]}" -v "$work/pod/run:/run/ckptd" --entrypoint "${loadgen[0]}" "$image" \
  "${loadgen[@]:1}" --socket /run/ckptd/ckptd.sock
"${podman[@]}" stop -t 30 ckptd-image-daemon >/dev/null
others=$(find "$work/pod/root" -mindepth 1 ! -uid 1000 | head -n 5)
[ -z "$others" ] || die "files in the sidecar's root not owned by uid 1000: $others"
echo "all $(find "$work/pod/root" -mindepth 1 | wc -l) files and directories written belong to uid 1000"
echo "== the image passed the demo"
