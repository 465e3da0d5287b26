#!/usr/bin/env bash
# Installs what shoal's build, tests and benchmarks need: Debian packages
# through apt-get and npm packages into the project-local tests/node/.
#
#   scripts/deps.sh              install anything missing, saying what it does
#   scripts/deps.sh --if-missing same, but silent when everything is present
#   scripts/deps.sh --check      exit 0 if the C build can run, 1 otherwise
#   scripts/deps.sh [--check|--if-missing] --cross aarch64-linux-gnu
#                                the same for `make CROSS=...`: the cross
#                                compiler, qemu-user, and the arm64 -dev
#                                packages through Debian multiarch
#                                (dpkg --add-architecture arm64)
# On macOS (uname -s Darwin) it installs through Homebrew instead
# (docs/macos.md).
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
# strace: test_daemon_nosync.sh checks which thread of shoald syncs files.
APT_PKGS+=(strace)
# openmpi-bin, libopenmpi-dev: the optional `make MPI=1` build (mpicc) and
# tests/integration/test_mpi.sh (mpirun); nothing else uses MPI (docs/mpi.md).
APT_PKGS+=(openmpi-bin libopenmpi-dev)
NPM_DIR=tests/node
mode=install
cross=
while [ $# -gt 0 ]; do
    case $1 in
        --check|--if-missing) mode=$1 ;;
        --cross) cross=${2:?--cross needs a triplet (aarch64-linux-gnu)}; shift ;;
        *) echo "deps: unknown argument $1 (--check, --if-missing, --cross TRIPLET)" >&2; exit 2 ;;
    esac
    shift
done

# ---- macOS: Homebrew ----------------------------------------------------------
if [ "$(uname -s)" = Darwin ]; then
    # bash 4+ and the GNU tools: the integration scripts use them (docs/macos.md)
    BREW_PKGS=(pkg-config curl sqlite libevent jansson pcre2 cmocka xxhash openssl@3 python numpy
               bash coreutils gnu-sed grep findutils)
    command -v brew >/dev/null || { echo "deps: install Homebrew first (https://brew.sh), then run this again" >&2; exit 1; }
    if [ "$mode" = --check ]; then
        PKG_CONFIG_PATH=$(for k in openssl@3 sqlite curl libevent; do printf '%s:' "$(brew --prefix)/opt/$k/lib/pkgconfig"; done)${PKG_CONFIG_PATH:-}
        export PKG_CONFIG_PATH
        command -v pkg-config >/dev/null && pkg-config --exists "${PC_PKGS[@]}"
        exit $?
    fi
    missing=()
    for p in "${BREW_PKGS[@]}"; do brew list --versions "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "deps: brew install ${missing[*]}"
        brew install "${missing[@]}" || { echo "deps: brew install failed for: ${missing[*]}" >&2; exit 1; }
    elif [ "$mode" = install ]; then
        echo "deps: Homebrew packages present (${#BREW_PKGS[@]} checked)"
    fi
    exit 0
fi

# ---- a cross build: Debian multiarch ---------------------------------------------
# The -dev packages of the target architecture install beside the host's
# (Multi-Arch: same).  libevent-dev is not multi-arch (installing its arm64
# package would remove the host's), so only its runtime libraries come in:
# the headers are the host's (the same on every 64-bit Linux) and the
# Makefile links the libraries by file name.
if [ -n "$cross" ]; then
    arch=$(case $cross in aarch64-*) echo arm64 ;; x86_64-*) echo amd64 ;; *) echo "" ;; esac)
    [ -n "$arch" ] || { echo "deps: no Debian architecture known for $cross" >&2; exit 2; }
    CROSS_APT=(gcc-$cross qemu-user)
    for p in libcurl4-openssl-dev libsqlite3-dev libssl-dev libjansson-dev libpcre2-dev \
             libcmocka-dev libxxhash-dev libevent-2.1-7 libevent-pthreads-2.1-7; do
        CROSS_APT+=("$p:$arch")
    done
    missing=()
    for p in "${CROSS_APT[@]}"; do
        st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [ "$st" = "install ok installed" ] || missing+=("$p")
    done
    if [ "$mode" = --check ]; then
        [ ${#missing[@]} -eq 0 ] || { echo "deps: missing for $cross: ${missing[*]}" >&2; exit 1; }
        exit 0
    fi
    [ ${#missing[@]} -eq 0 ] || [ "$(id -u)" = 0 ] || command -v sudo >/dev/null \
        || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    if [ ${#missing[@]} -gt 0 ]; then
        echo "deps: for $cross: apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        added=
        if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
            $SUDO dpkg --add-architecture "$arch" && added=1
        fi
        # A mirror without $arch's indices fails every later apt-get update
        # while the architecture stays added: take it back out on failure
        # (possible while none of its packages is installed).
        undo() {
            [ -z "$added" ] || $SUDO dpkg --remove-architecture "$arch" 2>/dev/null || true
            echo "deps: $1" >&2; exit 1
        }
        $SUDO apt-get update -qq || undo "apt-get update failed with $arch added; check the network or the apt sources"
        $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
            || undo "apt-get install failed for: ${missing[*]}"
    elif [ "$mode" = install ]; then
        echo "deps: packages for $cross present (${#CROSS_APT[@]} checked)"
    fi
    exit 0
fi

if [ "$mode" = "--check" ]; then
    command -v pkg-config >/dev/null && pkg-config --exists "${PC_PKGS[@]}"
    exit $?
fi

say() { [ "$mode" = "--if-missing" ] && [ -z "${said:-}" ] && { said=1; echo "deps: installing what is missing"; }; echo "deps: $*"; }

missing=()
# One line per installed architecture: with the arm64 -dev packages of the
# cross build beside the native ones, a name has two (dpkg-query -W prints
# both), and the native one (or an arch: all package) is what counts.
native=$(dpkg --print-architecture 2>/dev/null || echo amd64)
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status} ${Architecture}\n' "$p" 2>/dev/null \
        | grep -qE "^install ok installed ($native|all)\$" || missing+=("$p")
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
