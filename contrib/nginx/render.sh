#!/usr/bin/env bash
# render.sh — fills in hf-mirror.conf.in (and, for a standalone nginx,
# nginx-standalone.conf.in) from a few variables, checking each.
#
#   contrib/nginx/render.sh [VAR=value ...] > /etc/nginx/conf.d/hf-mirror.conf
#   contrib/nginx/render.sh --standalone DIR [VAR=value ...]
#       writes DIR/nginx.conf and DIR/hf-mirror.conf; run nginx -p DIR -c DIR/nginx.conf
#
# Variables (also read from the environment; docs/mirror.md explains them):
#   LISTEN      address:port or port to listen on            (8080)
#   HUB_URL     the Hub, scheme://host[:port], no path        (https://huggingface.co)
#   CDN_HOSTS   space-separated CDN hosts the mirror may fetch from; '*'
#               matches any run of [a-z0-9.-]; host:port allowed
#               (cas-bridge.xethub.hf.co cdn-lfs*.hf.co *.cdn.hf.co)
#   CDN_SCHEME  https or http (the scheme of those hosts)     (https)
#   CACHE_DIR   where the cache lives (created by nginx)      (/var/cache/nginx/hf-mirror)
#   CACHE_SIZE  bound of the CDN bytes, nginx size: 500g, 2t  (500g)
# Rarely needed:
#   PUBLIC_URL  how clients reach the mirror, for the redirects it writes
#               (default: the scheme and Host of each request)
#   RESOLVER    DNS servers for the CDN names (default: /etc/resolv.conf's)
#   CA_FILE     CA bundle to verify the Hub's and CDN's TLS
#               (/etc/ssl/certs/ca-certificates.crt)
#   ACCESS_LOG  the JSON-lines request log  (/var/log/nginx/hf-mirror.log;
#               standalone: DIR/access.log)
#   WORKERS, RUN_USER   standalone only: worker_processes (auto), user
#               (unset: nginx's default; as root, workers run as that user)
set -euo pipefail
shopt -u patsub_replacement 2>/dev/null || true
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "render.sh: $*" >&2; exit 2; }

standalone=
if [ "${1:-}" = --standalone ]; then
    [ $# -ge 2 ] || die "--standalone needs a directory"
    standalone=$2
    shift 2
fi
for kv in "$@"; do
    case $kv in
        LISTEN=*|HUB_URL=*|CDN_HOSTS=*|CDN_SCHEME=*|CACHE_DIR=*|CACHE_SIZE=*|PUBLIC_URL=*|RESOLVER=*|CA_FILE=*|ACCESS_LOG=*|WORKERS=*|RUN_USER=*)
            printf -v "${kv%%=*}" '%s' "${kv#*=}" ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$kv' (VAR=value with VAR one of the names in --help)" ;;
    esac
done

LISTEN=${LISTEN:-8080}
HUB_URL=${HUB_URL:-https://huggingface.co}
HUB_URL=${HUB_URL%/}
CDN_HOSTS=${CDN_HOSTS:-cas-bridge.xethub.hf.co cdn-lfs*.hf.co *.cdn.hf.co}
CDN_SCHEME=${CDN_SCHEME:-https}
CACHE_DIR=${CACHE_DIR:-/var/cache/nginx/hf-mirror}
CACHE_DIR=${CACHE_DIR%/}
CACHE_SIZE=${CACHE_SIZE:-500g}
PUBLIC_URL=${PUBLIC_URL:-}
CA_FILE=${CA_FILE:-/etc/ssl/certs/ca-certificates.crt}
WORKERS=${WORKERS:-auto}
RUN_USER=${RUN_USER:-}
if [ -n "$standalone" ]; then
    case $standalone in /*) ;; *) standalone=$PWD/$standalone ;; esac
    ACCESS_LOG=${ACCESS_LOG:-$standalone/access.log}
else
    ACCESS_LOG=${ACCESS_LOG:-/var/log/nginx/hf-mirror.log}
fi

# ---- checks: each value lands in nginx syntax, so nothing odd gets through
[[ $LISTEN =~ ^(([0-9]{1,3}\.){3}[0-9]{1,3}:|\[[0-9a-fA-F:]+\]:)?[0-9]{1,5}$ ]] \
    || die "LISTEN='$LISTEN': want a port (8080) or address:port (192.168.1.5:8080, [::]:8080)"
[[ $HUB_URL =~ ^(https?)://([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(:([0-9]{1,5}))?$ ]] \
    || die "HUB_URL='$HUB_URL': want scheme://host[:port] with no path (https://huggingface.co)"
HUB_SCHEME=${BASH_REMATCH[1]}
HUB_NAME=${BASH_REMATCH[2]}
HUB_PORT=${BASH_REMATCH[4]:-}
HUB_HOST=$HUB_NAME${HUB_PORT:+:$HUB_PORT}
if [ -z "$HUB_PORT" ]; then
    [ "$HUB_SCHEME" = https ] && HUB_PORT=443 || HUB_PORT=80
fi
HUB_HOSTPORT=$HUB_NAME:$HUB_PORT
[[ $CDN_SCHEME =~ ^https?$ ]] || die "CDN_SCHEME='$CDN_SCHEME': want https or http"
[[ $CACHE_DIR =~ ^/[A-Za-z0-9._/+-]*$ ]] \
    || die "CACHE_DIR='$CACHE_DIR': want an absolute path of letters, digits and ._/+-"
[[ $ACCESS_LOG =~ ^(/[A-Za-z0-9._/+-]*|off)$ ]] \
    || die "ACCESS_LOG='$ACCESS_LOG': want an absolute path or off"
[[ $CACHE_SIZE =~ ^([0-9]+)([kKmMgGtT])$ ]] || die "CACHE_SIZE='$CACHE_SIZE': want a number and k, m, g or t (500g, 2t)"
n=${BASH_REMATCH[1]}
case ${BASH_REMATCH[2]} in k|K) mib=$((n / 1024)) ;; m|M) mib=$n ;; g|G) mib=$((n * 1024)) ;; t|T) mib=$((n * 1024 * 1024)) ;; esac
if [ -n "$PUBLIC_URL" ]; then
    re_url='^https?://[][A-Za-z0-9.:-]+$'
    [[ $PUBLIC_URL =~ $re_url ]] \
        || die "PUBLIC_URL='$PUBLIC_URL': want scheme://host[:port] with no path"
else
    PUBLIC_URL='$scheme://$http_host'
fi
[[ $WORKERS =~ ^([0-9]+|auto)$ ]] || die "WORKERS='$WORKERS': want a number or auto"
[[ -z $RUN_USER || $RUN_USER =~ ^[a-z_][a-z0-9_-]*$ ]] || die "RUN_USER='$RUN_USER': want a user name"

# The keys zone: one key per 2 MiB slice, ~8,000 keys per MiB of zone (the
# nginx documentation), and a quarter more; at least 8 MiB.
zone=$(( (mib / 2 * 5 / 4) / 8000 + 1 ))
[ $zone -ge 8 ] || zone=8
KEYS_ZONE=${zone}m

# CDN_HOSTS -> one anchored alternation with no capturing group.
alts=()
for h in $CDN_HOSTS; do
    [[ $h =~ ^[a-z0-9*.-]+(:[0-9]{1,5})?$ ]] \
        || die "CDN_HOSTS entry '$h': want a lower-case host name with optional '*' and :port"
    r=${h//./\\.}
    r=${r//\*/[a-z0-9.-]*}
    alts+=("$r")
done
[ ${#alts[@]} -gt 0 ] || die "CDN_HOSTS is empty: name at least one CDN host"
CDN_RE="(?:$(IFS='|'; echo "${alts[*]}"))"

if [ -z "${RESOLVER:-}" ]; then
    RESOLVER=$(awk '$1 == "nameserver" { a = $2; if (a ~ /:/) a = "[" a "]"; printf "%s ", a }' \
               /etc/resolv.conf 2>/dev/null || true)
    RESOLVER=${RESOLVER% }
    [ -n "$RESOLVER" ] || RESOLVER=127.0.0.1
fi
re_ips='^[][0-9A-Fa-f.: ]+$'
[[ $RESOLVER =~ $re_ips ]] || die "RESOLVER='$RESOLVER': want IP addresses separated by spaces"

SSL_VERIFY=
if [ "$HUB_SCHEME" = https ] || [ "$CDN_SCHEME" = https ]; then
    [ -r "$CA_FILE" ] || die "CA_FILE '$CA_FILE' is not readable: install ca-certificates or set CA_FILE"
    SSL_VERIFY="    proxy_ssl_verify on;
    proxy_ssl_verify_depth 4;
    proxy_ssl_trusted_certificate $CA_FILE;"
fi

fill() {   # fill FILE: every @NAME@ replaced by $NAME; any left over is an error
    local text v
    text=$(cat "$1")
    for v in LISTEN HUB_URL HUB_SCHEME HUB_NAME HUB_HOST HUB_HOSTPORT CDN_SCHEME CDN_RE CACHE_DIR \
             CACHE_SIZE KEYS_ZONE PUBLIC_URL RESOLVER SSL_VERIFY ACCESS_LOG PREFIX WORKERS USER_LINE; do
        text=${text//"@$v@"/"${!v:-}"}
    done
    if [[ $text =~ @[A-Z_]+@ ]]; then
        die "internal: ${BASH_REMATCH[0]} left unfilled in $1"
    fi
    printf '%s\n' "$text"
}

if [ -z "$standalone" ]; then
    PREFIX= USER_LINE=
    fill "$here/hf-mirror.conf.in"
else
    PREFIX=$standalone
    USER_LINE=${RUN_USER:+user $RUN_USER;}
    mkdir -p "$PREFIX/tmp" "$CACHE_DIR"
    fill "$here/hf-mirror.conf.in" > "$PREFIX/hf-mirror.conf"
    fill "$here/nginx-standalone.conf.in" > "$PREFIX/nginx.conf"
    echo "render.sh: wrote $PREFIX/nginx.conf and $PREFIX/hf-mirror.conf; run: nginx -p $PREFIX -c $PREFIX/nginx.conf" >&2
fi
