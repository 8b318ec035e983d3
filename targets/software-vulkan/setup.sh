#!/bin/bash
# A software Vulkan (Mesa's lavapipe) in a folder, for running `--runtime litert-gpu` where there
# is no GPU: CI, or a desk without one. Nothing is installed on the host; packages are unpacked.
# Usage: setup.sh DIR        then:  . DIR/env.sh   (sets VK_ICD_FILENAMES and LD_LIBRARY_PATH)
# Mesa >= 25 is needed (LiteRT's WebGPU accelerator refuses bookworm's 22.3), so mesa comes from
# bookworm-backports; the Vulkan loader and Mesa's libraries from the release. Archive addresses come
# from the host's own apt configuration.
set -euo pipefail
D=$(realpath -m "${1:?usage: setup.sh DIR}")
. "$(dirname "$0")/../../docker/debian-archive.sh"  # SUITE, URI, archive_answers; exit 77 where the host lacks one
archive_answers "$SUITE-backports"
ARCH=$(dpkg --print-architecture)
A=$(mktemp -d); trap 'rm -rf "$A"' EXIT
mkdir -p "$A"/etc/apt/{sources.list.d,preferences.d,apt.conf.d} "$A"/var/lib/apt/lists/partial "$A"/var/lib/dpkg
touch "$A"/var/lib/dpkg/status
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' "$URI" "$SUITE" "$URI" "$SUITE-backports" > "$A"/etc/apt/sources.list
printf 'Dir "%s/";\nDir::State::status "%s/var/lib/dpkg/status";\nDir::Etc::TrustedParts "/etc/apt/trusted.gpg.d/";\nAPT::Architecture "%s";\nDebug::NoLocking "true";\nAPT::Sandbox::User "root";\n' "$A" "$A" "$ARCH" > "$A"/apt.conf
APT_CONFIG=$A/apt.conf apt-get -qq update
# The loader, lavapipe and the libraries the host may lack (a minimal host has none of Mesa's).
PKGS=("mesa-vulkan-drivers/$SUITE-backports" libvulkan1)
for dep in $(APT_CONFIG=$A/apt.conf apt-cache depends --no-recommends --no-suggests "mesa-vulkan-drivers/$SUITE-backports" 2>/dev/null \
             | awk '/Depends:/ {print $2}' | tr -d '<>'); do
  case "$dep" in libc6|libgcc-s1|libstdc++6|libvulkan1) continue;; esac
  dpkg -s "$dep" >/dev/null 2>&1 || PKGS+=("$dep")
done
mkdir -p "$D"; (cd "$A" && APT_CONFIG=$A/apt.conf apt-get -qq download "${PKGS[@]}")
rm -rf "$D/root"; for f in "$A"/*.deb; do dpkg -x "$f" "$D/root"; done
LIB=$(dirname "$(find "$D/root" -name 'libvulkan_lvp.so' | head -n1)")
[ -f "$LIB/libvulkan_lvp.so" ] || { echo "lavapipe not found in mesa-vulkan-drivers" >&2; exit 1; }
# The ICD json names its library by absolute path: the unpacked one, not the host's.
ICD=$(find "$D/root" -path '*/vulkan/icd.d/lvp_icd*.json' | head -n1)
python3 - "$ICD" "$LIB/libvulkan_lvp.so" "$D/lvp_icd.json" <<'PY'
import json, sys
shipped, library, out = sys.argv[1:4]
icd = json.load(open(shipped))
icd["ICD"]["library_path"] = library
json.dump(icd, open(out, "w"), indent=1)
PY
LOADER=$(dirname "$(find "$D/root" -name 'libvulkan.so.1' | head -n1)")
cat > "$D/env.sh" <<ENV
export VK_ICD_FILENAMES=$D/lvp_icd.json
export LD_LIBRARY_PATH=$LOADER\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV
echo "software Vulkan in $D: $(basename "$(ls "$A"/mesa-vulkan-drivers_*.deb)")"
