#!/bin/sh
# Runs inside the fresh bookworm root (as mmdebstrap's customize hook, chrooted) after the
# packages of packages.txt are installed. Creates the unprivileged user every process of a
# computer runs as, and trims what a computer never needs.
set -eu

# The workspace user: uid/gid 1000, home at the workspace mount point.
groupadd --gid 1000 rakazo
useradd --uid 1000 --gid 1000 --home-dir /home/rakazo --no-create-home --shell /bin/bash rakazo
mkdir -p /home/rakazo
chown 1000:1000 /home/rakazo
chmod 0755 /home/rakazo

# X server sockets live in a directory the host may bind-mount (see src/providers/docker).
mkdir -p /tmp/.X11-unix
chmod 1777 /tmp /tmp/.X11-unix

# Lean: no package lists, caches, docs or man pages in the image.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* \
       /usr/share/info/* /var/log/*.log /var/log/apt/*

# One font cache for every user, valid as imported: without it every fresh home (each
# computer's browser cache) built its own, about 0.7 s of the first browser start. Fontconfig
# takes a cache for stale when a font directory's time differs from the one it recorded, and
# the image's tarball clamps every file time to the build's start. So the font directories
# (and those their links point to) get one fixed time from before any build, then the system
# cache is made again.
for dir in /usr/share/fonts /usr/local/share/fonts; do
    if [ -d "$dir" ]; then
        find -L "$dir" -type d -exec touch -d @946684800 {} +
    fi
done
fc-cache --system-only --force
