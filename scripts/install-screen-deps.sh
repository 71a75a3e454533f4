#!/usr/bin/env bash
# Installs what the real-screen tests and the screen benchmark need: a virtual X display,
# x11vnc, websockify with noVNC's files, X utilities to read the pointer, Chromium for the
# headless noVNC check, and term.js for the dashboard's Terminal window. Debian/Ubuntu only; idempotent.
set -euo pipefail

need=()
command -v Xvfb >/dev/null || need+=(xvfb)
command -v x11vnc >/dev/null || need+=(x11vnc)
command -v websockify >/dev/null || need+=(websockify)
[ -f /usr/share/novnc/vnc.html ] || need+=(novnc)
command -v xdpyinfo >/dev/null || need+=(x11-utils)
command -v xdotool >/dev/null || need+=(xdotool)
[ -f /usr/share/javascript/term.js/term.js ] || need+=(libjs-term.js)
if [ "${RAKAZO_SKIP_CHROMIUM:-0}" != 1 ]; then
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need+=(chromium)
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "screen dependencies present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${need[@]}"
