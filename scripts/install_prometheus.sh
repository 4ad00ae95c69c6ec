#!/bin/sh
# Installs Prometheus and promtool for the tests (`make prometheus-tools`): the Debian package
# `prometheus` (2.42 in Debian 12), unpacked into DEST (default .venv/prometheus) without root
# (`apt-get download` + `dpkg-deb -x`). Binaries already on PATH are linked instead.
# Exit 0 when DEST/bin has both binaries; otherwise one line on stderr and exit 1 (the tests
# that need them then skip, saying why).
set -eu
DEST=${1:-.venv/prometheus}
BIN="$DEST/bin"

if [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ]; then
    exit 0
fi
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    mkdir -p "$BIN"
    ln -sf "$(command -v prometheus)" "$BIN/prometheus"
    ln -sf "$(command -v promtool)" "$BIN/promtool"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "install_prometheus.sh: no apt-get/dpkg-deb here; install prometheus and promtool (2.x) on PATH" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download() { (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); }
if ! download; then
    # the package lists may be missing or stale; refreshing them needs root
    if [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && download; then
        :
    else
        echo "install_prometheus.sh: 'apt-get download prometheus' failed (no package lists? run apt-get update as root)" >&2
        exit 1
    fi
fi
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
mkdir -p "$BIN"
cp "$tmp/root/usr/bin/prometheus" "$tmp/root/usr/bin/promtool" "$BIN/"
"$BIN/promtool" --version >/dev/null
echo "installed $("$BIN/prometheus" --version 2>&1 | head -n 1) into $BIN"
