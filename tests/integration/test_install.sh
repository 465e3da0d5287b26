#!/usr/bin/env bash
# test_install.sh — `make install` and the systemd service (docs/daemon.md,
# "Install"; README):
#   - make install DESTDIR=... puts the user binaries, a man page for each,
#     a bash completion for each, the user unit and the docs under PREFIX,
#     and nothing of the developer tools; the installed binaries run
#     (shoald --version, shoal --help); `man -l` renders every page; each
#     completion loads (`complete -p NAME`) and completes a subcommand
#   - make install-dev adds the developer tools; make uninstall removes
#     what install put there
#   - systemd-analyze verify accepts the user unit and the system-wide
#     example as installed (PREFIX without DESTDIR, so ExecStart= exists),
#     with nothing to say
#   - Type=notify: shoald tells NOTIFY_SOCKET READY=1 once its socket
#     listens (a client connects right after) and STOPPING=1 on SIGTERM
#     (skipped in a build without libsystemd)
source "$(dirname "$0")/lib.sh"
command -v man >/dev/null || skip "man not installed (Debian package man-db; make deps)"
command -v systemd-analyze >/dev/null || skip "systemd-analyze not installed (package systemd; make deps)"
cd "$ROOT" || fail "no $ROOT"
MAKEV=(--no-print-directory BUILD="${BUILD:-build}" BIN="$BIN")

D=$T/dest P=/usr/local
make "${MAKEV[@]}" install DESTDIR="$D" > "$T/install.log" 2>&1 || fail "make install: $(tail -5 "$T/install.log")"
for b in shoald shoal shoal-engine shoal-fetch; do
    [ -x "$D$P/bin/$b" ] || fail "$P/bin/$b not installed"
    s=1; [ $b = shoald ] && s=8
    [ -f "$D$P/share/man/man$s/$b.$s" ] || fail "no man page $b.$s"
    MANWIDTH=80 man -l "$D$P/share/man/man$s/$b.$s" > "$T/$b.txt" 2> "$T/$b.manerr" \
        || fail "man -l $b.$s: $(cat "$T/$b.manerr")"
    [ ! -s "$T/$b.manerr" ] || fail "man -l $b.$s warns: $(head -3 "$T/$b.manerr")"
    grep -q 'EXIT STATUS' "$T/$b.txt" && grep -q '^SYNOPSIS' "$T/$b.txt" || fail "$b.$s lacks its sections"
    c=$D$P/share/bash-completion/completions/$b
    bash -c "source '$c' && complete -p $b" > "$T/comp" 2>&1 || fail "completion of $b: $(cat "$T/comp")"
    grep -q "^complete -F .* $b\$" "$T/comp" || fail "completion of $b: $(cat "$T/comp")"
done
for b in hubmock mkmodel hubget stinfo shoalc; do
    [ -e "$D$P/bin/$b" ] && fail "developer tool $b installed by make install"
done
"$D$P/bin/shoald" --version | grep -qx "shoald [0-9.]*" || fail "installed shoald --version"
"$D$P/bin/shoal" --help | grep -q '^usage: shoal ' || fail "installed shoal --help"
"$D$P/bin/shoal-engine" info > /dev/null || fail "installed shoal-engine info"
grep -q 'shoal warm' "$T/shoal.txt" && grep -q 'shoal doctor' "$T/shoal.txt" \
    || fail "shoal's man page lacks its commands"
grep -q 'SHARED OPTIONS' "$T/shoal-engine.txt" && grep -q 'shoal-engine serve' "$T/shoal-engine.txt" \
    || fail "shoal-engine's man page lacks its commands or shared options"
grep -q -- '--metrics' "$T/shoald.txt" || fail "shoald's man page lacks --metrics"
# the completion completes
out=$(bash -c "source '$D$P/share/bash-completion/completions/shoal'
    COMP_WORDS=(shoal st); COMP_CWORD=1; _shoal_complete_shoal; echo \"\${COMPREPLY[*]}\"
    COMP_WORDS=(shoal stats --by ''); COMP_CWORD=3; _shoal_complete_shoal; echo \"\${COMPREPLY[*]}\"")
[ "$out" = $'stats\nlayer expert session' ] || fail "shoal's completion gave: $out"
U=$D$P/lib/systemd/user/shoald.service
[ -f "$U" ] || fail "no user unit"
grep -qx "ExecStart=$P/bin/shoald --home %C/shoal" "$U" || fail "ExecStart: $(grep ExecStart "$U")"
grep -qx 'Type=notify' "$U" || fail "the user unit is not Type=notify"
[ -f "$D$P/share/doc/shoal/examples/shoald-system.service" ] || fail "no system-wide example"
[ -f "$D$P/share/doc/shoal/docs/daemon.md" ] && [ -f "$D$P/share/doc/shoal/README.md" ] || fail "docs"

make "${MAKEV[@]}" install-dev DESTDIR="$D" > "$T/dev.log" 2>&1 || fail "make install-dev: $(tail -3 "$T/dev.log")"
[ -x "$D$P/bin/hubmock" ] && [ -f "$D$P/share/man/man1/mkmodel.1" ] || fail "install-dev"
make "${MAKEV[@]}" uninstall DESTDIR="$D" > "$T/un.log" 2>&1 || fail "make uninstall"
left=$(find "$D" -type f | sed "s|^$D||")
[ -z "$left" ] || fail "make uninstall left: $left"

# ---- the units, as installed at a real PREFIX -------------------------------------------
R=$T/prefix
make "${MAKEV[@]}" install PREFIX="$R" > "$T/install2.log" 2>&1 || fail "make install PREFIX=$R"
for u in "$R/lib/systemd/user/shoald.service" "$R/share/doc/shoal/examples/shoald-system.service"; do
    grep -q "^ExecStart=$R/bin/shoald " "$u" || fail "$u: ExecStart $(grep ExecStart "$u")"
    # verify checks ExecStart= exists and `man shoald(8)` (Documentation=) renders
    MANPATH=$R/share/man systemd-analyze verify "$u" > "$T/verify.out" 2>&1 \
        || fail "systemd-analyze verify $u: $(cat "$T/verify.out")"
    [ ! -s "$T/verify.out" ] || fail "systemd-analyze verify $u says: $(cat "$T/verify.out")"
done

# ---- Type=notify: READY=1 once the socket listens, STOPPING=1 at SIGTERM ----------------
if ! ldd "$BIN/shoald" | grep -q libsystemd; then
    echo "note: shoald built without libsystemd: the notify check is skipped"
    exit 0
fi
cat > "$T/notify.py" <<'PY'
import os, socket, sys, time
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(30)
with open(out, "a") as f:
    while True:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            break
        f.write(msg.replace("\n", " ") + "\n")
        f.flush()
        if "STOPPING=1" in msg:
            break
PY
bg notify python3 "$T/notify.py" "$T/notify.sock" "$T/notify.out"
for _ in $(seq 50); do [ -S "$T/notify.sock" ] && break; sleep 0.1; done
H=$T/home
NOTIFY_SOCKET=$T/notify.sock bg shoald "$BIN/shoald" --home "$H" --no-fsync
wait_line "$T/notify.out" 'READY=1' 20 || fail "no READY=1 on NOTIFY_SOCKET"
grep -q "READY=1 STATUS=serving $H/shoald.sock" "$T/notify.out" || fail "READY: $(cat "$T/notify.out")"
"$BIN/shoalc" --home "$H" stats > /dev/null || fail "READY=1 was sent before the socket answered"
kill -TERM "$PID_shoald"
wait "$PID_shoald" || fail "shoald exited non-zero on SIGTERM"
wait_line "$T/notify.out" 'STOPPING=1' 10 || fail "no STOPPING=1: $(cat "$T/notify.out")"
echo "ok: make install tree runs; units verify; READY=1 and STOPPING=1 reach systemd"
