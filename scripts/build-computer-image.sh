#!/usr/bin/env bash
# Builds the computer image from config/computer-image/ (Debian packages via mmdebstrap, then
# `docker import`) as rakazo-computer:<recipe hash>, unless that tag already exists. Prints the
# image reference. `rakazo image build` does the same from the recipe built into the binary;
# both derive the tag as the first 16 hex digits of sha256(packages.txt ++ setup.sh).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
recipe="$root/config/computer-image"
hash="$(cat "$recipe/packages.txt" "$recipe/setup.sh" | sha256sum | cut -c1-16)"
image="rakazo-computer:$hash"

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
fi

if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "build-computer-image: installing mmdebstrap" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

packages="$(grep -v '^\s*#' "$recipe/packages.txt" | grep -v '^\s*$' | paste -sd, -)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "build-computer-image: building $image" >&2
started=$(date +%s)
mmdebstrap --quiet --mode=root --variant=apt \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --include="$packages" \
    --customize-hook="chroot \"\$1\" sh -s < '$recipe/setup.sh'" \
    bookworm "$work/rootfs.tar" >&2
docker import \
    --change 'USER 1000:1000' \
    --change 'WORKDIR /home/rakazo' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/home/rakazo' \
    --change 'CMD ["sleep", "infinity"]' \
    --message "rakazo computer image $hash" \
    "$work/rootfs.tar" "$image" >/dev/null
echo "build-computer-image: built $image in $(( $(date +%s) - started ))s, $(du -h "$work/rootfs.tar" | cut -f1) tarball" >&2
echo "$image"
