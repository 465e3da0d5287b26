#!/usr/bin/env bash
# Installs what shoal's build, tests and benchmarks need: Debian packages
# through apt-get and npm packages into the project-local tests/node/.
#
#   scripts/deps.sh              install anything missing, saying what it does
#   scripts/deps.sh --if-missing same, but silent when everything is present
#   scripts/deps.sh --check      exit 0 if the C build can run, 1 otherwise
#
# Idempotent: a second run with everything present takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(gcc make pkg-config libcurl4-openssl-dev libsqlite3-dev libevent-dev
          libssl-dev libjansson-dev libpcre2-dev libcmocka-dev libxxhash-dev
          python3-numpy curl clang nginx prometheus)
# nginx: the Hub mirror's test (contrib/nginx/, docs/mirror.md) runs its own
# nginx on loopback; Debian's `nginx` binary has the slice, auth_request and
# ssl modules.  On a machine with systemd, installing it also starts the
# stock nginx.service on port 80, which nothing here uses
# (`systemctl disable --now nginx` stops it).
# prometheus: promtool checks /metrics in tests.
# The NEON kernels are cross-built and run under qemu-user on x86 machines.
[ "$(uname -m)" = x86_64 ] && APT_PKGS+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
PC_PKGS=(libcurl sqlite3 libevent libevent_pthreads jansson libpcre2-8 cmocka
         libxxhash libcrypto)
# libsystemd-dev: shoald's sd_notify (optional: the Makefile builds without
# it, so it is not in PC_PKGS); systemd: systemd-analyze verifies the units
# (no running systemd needed); man-db: `man -l` renders the man pages.
APT_PKGS+=(libsystemd-dev systemd man-db)
# openmpi-bin, libopenmpi-dev: the optional `make MPI=1` build (mpicc) and
# tests/integration/test_mpi.sh (mpirun); nothing else uses MPI (docs/mpi.md).
APT_PKGS+=(openmpi-bin libopenmpi-dev)
NPM_DIR=tests/node
mode=${1:-install}

if [ "$mode" = "--check" ]; then
    command -v pkg-config >/dev/null && pkg-config --exists "${PC_PKGS[@]}"
    exit $?
fi

say() { [ "$mode" = "--if-missing" ] && [ -z "${said:-}" ] && { said=1; echo "deps: installing what is missing"; }; echo "deps: $*"; }

missing=()
for p in "${APT_PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
# Node.js and npm: a machine may carry them from another source than
# Debian's (nodesource bundles npm into nodejs); the commands are what count.
command -v node >/dev/null || missing+=(nodejs)
command -v npm  >/dev/null || missing+=(npm)

SUDO=
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
        [ ${#missing[@]} -eq 0 ] || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    fi
fi

if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq || { echo "deps: apt-get update failed; check the network or the apt sources" >&2; exit 1; }
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || { echo "deps: apt-get install failed for: ${missing[*]}" >&2; exit 1; }
elif [ "$mode" = install ]; then
    echo "deps: Debian packages present (${#APT_PKGS[@]} checked)"
fi

# npm packages, pinned in tests/node/package.json, installed locally.
if [ -f "$NPM_DIR/package.json" ]; then
    need_npm=0
    for dep in $(node -e 'const p=require("./'"$NPM_DIR"'/package.json");console.log(Object.keys(p.dependencies||{}).join(" "))'); do
        [ -d "$NPM_DIR/node_modules/$dep" ] || need_npm=1
    done
    if [ $need_npm = 1 ]; then
        say "npm install in $NPM_DIR"
        (cd "$NPM_DIR" && npm install --no-audit --no-fund --loglevel=error >/dev/null) \
            || { echo "deps: npm install failed in $NPM_DIR" >&2; exit 1; }
    elif [ "$mode" = install ]; then
        echo "deps: npm packages present in $NPM_DIR"
    fi
fi
exit 0
