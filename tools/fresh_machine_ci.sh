#!/usr/bin/env bash
# CI on a machine that never ran the project: a Debian root made by debootstrap (minbase) with only the README's
# prerequisites (Python 3.11+ with venv, g++, make, git), a clean clone of this checkout's HEAD in it, and
# `bash .ci/run` run inside it in a private mount namespace. Whatever `make test` needs beyond the prerequisites must
# be installed by the project's own files, or this run fails.
#
#   sudo tools/fresh_machine_ci.sh [DIR] [RELEASE] [COMMAND]
#       DIR default build/fresh; RELEASE bookworm (or trixie); COMMAND default `bash .ci/run` (e.g. `make rehearse`)
#
# What it shares with this machine: the kernel, the network (apt and PyPI reach the same registries) and, read-only,
# this machine's pip configuration, CA certificates (the network's TLS proxy) and local wheel folders (/opt/wheels:
# the CPU build of torch; the machine's PyPI mirrors), as CI's machines have them. Nothing the project installed here
# (Debian packages, venvs) is visible. DIR/base (debootstrap + prerequisites) is made once and never changed; each run
# works in a new copy of it, DIR/run, so every run starts on a machine that never ran the project.
set -euo pipefail
PROJECT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$(realpath -m "${1:-$PROJECT/build/fresh}")"
BASE="$DIR/base"
ROOT="$DIR/run"
RELEASE="${2:-bookworm}"
COMMAND="${3:-bash .ci/run}"
PREREQUISITES="python3 python3-venv g++ make git ca-certificates"
[ "$(id -u)" = 0 ] || { echo "needs root (debootstrap, mount namespaces)"; exit 1; }
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    debootstrap >/dev/null

if [ ! -f "$BASE/.prerequisites" ]; then
    rm -rf "$BASE"
    echo "[fresh] debootstrap --variant=minbase $RELEASE $BASE"
    debootstrap --variant=minbase "$RELEASE" "$BASE" http://deb.debian.org/debian >/dev/null
    cp /etc/resolv.conf "$BASE/etc/resolv.conf"
    chroot "$BASE" bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null && \
        apt-get install -y -q --no-install-recommends $PREREQUISITES >/dev/null"
    echo "$PREREQUISITES" > "$BASE/.prerequisites"
fi
echo "[fresh] a new machine: $ROOT, a copy of $BASE"
rm -rf "$ROOT"
cp -a "$BASE" "$ROOT"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# What an installed Debian has and debootstrap does not write: localhost in /etc/hosts (the rehearsal's network
# namespace has no DNS, only loopback).
[ -f "$ROOT/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$ROOT/etc/hosts"

# The clone: committed files of HEAD only, as CI's `git clone` gets them.
git clone -q --no-hardlinks "$PROJECT" "$ROOT/ci/llama3-triton"
echo "[fresh] clone of $(git -C "$PROJECT" rev-parse --short HEAD) at $ROOT/ci/llama3-triton; Debian $(cat "$ROOT/etc/debian_version")"

exec unshare --mount --propagation private -- bash -c '
set -euo pipefail
ROOT="$1"
mount --bind "$ROOT" "$ROOT"          # a mount point of its own, so that the tests can make / private in it
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
mount -t tmpfs tmpfs "$ROOT/tmp"
for shared in /opt/wheels /opt/pypi /opt/pypi-more; do
    [ -d "$shared" ] || continue
    mkdir -p "$ROOT$shared"; mount --bind -o ro "$shared" "$ROOT$shared"
done
mount --bind -o ro /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$ROOT/etc/xdg/pip" "$ROOT/root/.config/pip"
for config in /etc/pip.conf /etc/xdg/pip/pip.conf /etc/xdg/pip/constraints.txt /root/.config/pip/pip.conf; do
    [ -f "$config" ] && cp "$config" "$ROOT$config"
done
exec chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_FIND_LINKS=/opt/wheels PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    bash -c "cd /ci/llama3-triton && time $2"
' fresh "$ROOT" "$COMMAND"
