# Sourced by the set-up scripts (docker/local-base.sh, docker/arm64-emulation.sh,
# targets/software-vulkan/setup.sh): the host's Debian release and archive, from its own apt configuration.
#
# Exit codes of those scripts: 77 when this host lacks what they need (root, a tool, an archive in its apt
# sources, an archive that answers), with a line naming it; 2 for a wrong command line; anything else is a
# failure of the script itself. Tests skip on 77 only.
HOST_LACKS=77
. /etc/os-release; SUITE=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
URI=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v -E 'security|nodesource' | head -n1 || true)
[ -n "$URI" ] || URI=$(grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1 || true)
[ -n "$URI" ] || { echo "no Debian archive in this host's apt sources" >&2; exit "$HOST_LACKS"; }

# The archive answers for DIST (SUITE or SUITE-backports), else exit 77: a later apt-get failure is then the
# script's own, not the network's.
archive_answers() {
  python3 - "${URI%/}/dists/$1/Release" <<'PY' || { echo "the Debian archive does not answer from here: ${URI%/}/dists/$1/Release" >&2; exit "$HOST_LACKS"; }
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=30).read(1)
PY
}
