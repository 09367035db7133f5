#!/usr/bin/env bash
# Installs promtool (the Prometheus rule/metrics checker) into a git-ignored tools directory
# and prints its path. Idempotent: a working promtool already there is reused.
#
# promtool is taken from Debian's `prometheus` package by extracting the .deb (apt-get download +
# dpkg -x) rather than installing it, so no Prometheus daemon is ever started and root is not
# needed for the extraction. If apt cannot provide it, and a Go toolchain is present, it is built
# from the Prometheus Go module instead.
#
# Usage: scripts/install-promtool.sh            # prints e.g. /repo/.cache/tools/bin/promtool
# Env:   TOKENMILL_TOOLS_DIR  install prefix (default: <repo>/.cache/tools)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${TOKENMILL_TOOLS_DIR:-$repo_root/.cache/tools}"
bin_dir="$tools_dir/bin"
promtool="$bin_dir/promtool"

log() { echo "install-promtool: $*" >&2; }

works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if works "$promtool"; then
    echo "$promtool"
    exit 0
fi

mkdir -p "$bin_dir"
work_dir="$(mktemp -d)"
trap 'rm -rf "$work_dir"' EXIT

from_debian_package() {
    command -v apt-get >/dev/null 2>&1 || return 1
    command -v dpkg >/dev/null 2>&1 || return 1
    # apt-get download writes into the current directory; as root it may warn that the
    # download is unsandboxed, which is harmless here.
    if ! (cd "$work_dir" && apt-get download prometheus >&2); then
        log "apt-get download failed; refreshing the package lists once"
        if [ "$(id -u)" -eq 0 ]; then
            apt-get update >&2 || return 1
        elif command -v sudo >/dev/null 2>&1; then
            sudo -n apt-get update >&2 || return 1
        else
            return 1
        fi
        (cd "$work_dir" && apt-get download prometheus >&2) || return 1
    fi
    local deb
    deb="$(ls "$work_dir"/prometheus_*.deb 2>/dev/null | head -n 1 || true)"
    [ -n "$deb" ] || return 1
    dpkg -x "$deb" "$work_dir/extracted"
    [ -x "$work_dir/extracted/usr/bin/promtool" ] || return 1
    install -m 0755 "$work_dir/extracted/usr/bin/promtool" "$promtool"
}

from_go_module() {
    command -v go >/dev/null 2>&1 || return 1
    GOBIN="$bin_dir" go install github.com/prometheus/prometheus/cmd/promtool@latest >&2
}

if from_debian_package && works "$promtool"; then
    log "installed from the Debian prometheus package"
elif from_go_module && works "$promtool"; then
    log "built from the Prometheus Go module"
else
    log "could not install promtool: neither 'apt-get download prometheus' nor 'go install' worked"
    exit 1
fi

log "$("$promtool" --version 2>&1 | head -n 1)"
echo "$promtool"
