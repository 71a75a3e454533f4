#!/usr/bin/env bash
# Installs what the desktop runtime and its tests need from Debian's packages, idempotently:
# the X server, window manager, browser, screen gateway and the reference tools the bench
# compares against. Does nothing when every tool is already present.
set -euo pipefail

need=()
for tool in Xvfb x11vnc websockify fluxbox chromium xdpyinfo xdotool import scrot; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
[ -d /usr/share/novnc ] || need+=("novnc")

if [ "${#need[@]}" -eq 0 ]; then
    exit 0
fi

echo "install-desktop-deps: missing ${need[*]}; installing" >&2
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    xvfb x11vnc websockify novnc fluxbox chromium x11-utils xdotool imagemagick scrot \
    fonts-dejavu-core >/dev/null
