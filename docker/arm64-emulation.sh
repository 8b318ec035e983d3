#!/bin/bash
# Let an x86_64 host run aarch64 binaries, in chroots and containers: registers a static qemu-aarch64
# (>= 8) with binfmt_misc and the F flag (the kernel opens it at registration, so it works inside any
# mount namespace). Idempotent; needs root. Used by local-base.sh and before running arm64 images.
# qemu 7.x (bookworm's own) passes the host's x86 /proc/cpuinfo through and onnxruntime crashes on
# import: qemu-user comes from backports, through a private apt tree (the host's apt state is untouched).
set -euo pipefail
. "$(dirname "$0")/debian-archive.sh"  # SUITE, URI, archive_answers; exit 77 where this host lacks a need
[ "$(id -u)" = 0 ] || { echo "arm64-emulation.sh needs root (binfmt_misc)" >&2; exit "$HOST_LACKS"; }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
qemu_version() { local v; v=$("$1" --version 2>/dev/null | head -n1 | grep -oE '[0-9]+' | head -n1 || true); echo "${v:-0}"; }

BINFMT=/proc/sys/fs/binfmt_misc
[ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT" \
  || { echo "binfmt_misc cannot be mounted on this host (a container without it?)" >&2; exit "$HOST_LACKS"; }
QEMU=/var/lib/pe-export/qemu-aarch64-static
current=$(sed -n 's/^interpreter //p' "$BINFMT/qemu-aarch64" 2>/dev/null || true)
if [ ! -x "$QEMU" ] || [ "$(qemu_version "$QEMU")" -lt 8 ]; then
  current=
  # qemu 7.x passes the host's x86 /proc/cpuinfo through (onnxruntime crashes on import):
  # take qemu-user from backports through a private apt tree.
  A=$WORK/apt; mkdir -p "$A"/etc/apt/{sources.list.d,preferences.d,apt.conf.d} "$A"/var/lib/apt/lists/partial "$A"/var/lib/dpkg
  touch "$A"/var/lib/dpkg/status
  archive_answers "$SUITE-backports"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $URI $SUITE-backports main" > "$A"/etc/apt/sources.list
  printf 'Dir "%s/";\nDir::State::status "%s/var/lib/dpkg/status";\nDir::Etc::TrustedParts "/etc/apt/trusted.gpg.d/";\nDebug::NoLocking "true";\nAPT::Sandbox::User "root";\n' "$A" "$A" > "$A"/apt.conf
  APT_CONFIG=$A/apt.conf apt-get -qq update
  # From qemu 9, Debian's qemu-user binaries are static-pie and qemu-user-static only links to them.
  (cd "$WORK" && APT_CONFIG=$A/apt.conf apt-get -qq download "qemu-user/$SUITE-backports")
  mkdir -p "$(dirname "$QEMU")"
  dpkg -x "$WORK"/qemu-user_*.deb "$WORK/qemu"
  cp "$WORK/qemu/usr/bin/qemu-aarch64" "$QEMU.new"
  chmod 755 "$QEMU.new"
  [ "$(qemu_version "$QEMU.new")" -ge 8 ] || { echo "qemu-user from backports is older than 8" >&2; exit 1; }
  mv "$QEMU.new" "$QEMU"
fi
if [ "$current" != "$QEMU" ]; then
  [ -e "$BINFMT/qemu-aarch64" ] && echo -1 > "$BINFMT/qemu-aarch64"
  # F: the kernel opens the interpreter now, so it runs inside chroots and containers too.
  printf '%s' ":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:$QEMU:F" > "$BINFMT/register"
fi
