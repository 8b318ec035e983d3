#!/bin/bash
# Make a Debian base image locally, for hosts that reach a Debian archive and a Python package
# index but no container registry. The image has python3 + venv and the host's extra CA
# certificates (pip inside a build needs them where egress goes through an inspecting proxy).
# Usage (as root, with dockerd running):  docker/local-base.sh ARCH TAG
#   ARCH  amd64 or arm64 (arm64 on an x86 host runs through qemu and binfmt_misc, set up by
#         arm64-emulation.sh beside this script)
#   TAG   the image name to give it, e.g. pe-export-base:bookworm-arm64
# Then:   docker build --build-arg BASE=TAG -f docker/cpu.Dockerfile -t pe-export:cpu .
# Archive addresses come from the host's own apt configuration; the host's apt state is untouched.
set -euo pipefail
ARCH=${1:?usage: local-base.sh ARCH TAG}; TAG=${2:?usage: local-base.sh ARCH TAG}
case "$ARCH" in amd64|arm64) ;; *) echo "ARCH must be amd64 or arm64, got '$ARCH'" >&2; exit 2;; esac
. "$(dirname "$0")/debian-archive.sh"  # SUITE, URI, archive_answers; exit 77 where this host lacks a need
[ "$(id -u)" = 0 ] || { echo "local-base.sh needs root (debootstrap, binfmt_misc)" >&2; exit "$HOST_LACKS"; }
for tool in debootstrap docker dpkg apt-get; do
  command -v "$tool" >/dev/null || { echo "local-base.sh needs $tool (apt-get install debootstrap docker.io)" >&2; exit "$HOST_LACKS"; }
done
archive_answers "$SUITE"
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

if [ "$ARCH" = arm64 ] && [ "$(dpkg --print-architecture)" != arm64 ]; then
  "$(dirname "$0")/arm64-emulation.sh"
fi

ROOT=$WORK/rootfs
debootstrap --variant=minbase --arch "$ARCH" --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$ROOT" "$URI" > "$WORK/debootstrap.log" 2>&1 \
  || { tail -n 20 "$WORK/debootstrap.log" >&2; exit 1; }
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  # What update-ca-certificates would do for the bundle, without running the target's tools (slow
  # under emulation): OpenSSL, and so pip given PIP_CERT, read the bundle file.
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  cat /usr/local/share/ca-certificates/*.crt >> "$ROOT/etc/ssl/certs/ca-certificates.crt"
fi
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*

# `docker import --platform` is not honoured by every engine: set the architecture in the image
# config itself, so that `docker run --platform linux/$ARCH` and the builder see the truth.
tar -C "$ROOT" -c . | docker import --change 'CMD ["/bin/bash"]' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$TAG" >/dev/null
if [ "$(docker image inspect -f '{{.Architecture}}' "$TAG")" != "$ARCH" ]; then
  mkdir "$WORK/img"; docker save "$TAG" | tar -x -C "$WORK/img"
  python3 - "$WORK/img" "$ARCH" <<'EOF'
import hashlib, json, os, sys
root, arch = sys.argv[1], sys.argv[2]
manifest = json.load(open(os.path.join(root, "manifest.json")))
old = manifest[0]["Config"]
config = json.load(open(os.path.join(root, old)))
config["architecture"] = arch
data = json.dumps(config).encode()
new = hashlib.sha256(data).hexdigest() + ".json"
open(os.path.join(root, new), "wb").write(data)
os.remove(os.path.join(root, old))
manifest[0]["Config"] = new
json.dump(manifest, open(os.path.join(root, "manifest.json"), "w"))
EOF
  docker rmi "$TAG" >/dev/null
  tar -C "$WORK/img" -c . | docker load >/dev/null
fi
echo "$TAG: $(docker image inspect -f '{{.Os}}/{{.Architecture}} {{.Size}}' "$TAG") bytes"
