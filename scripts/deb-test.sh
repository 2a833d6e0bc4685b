#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (installed with `cargo install` if missing),
# installs it with dpkg, checks it, and removes (purges) it again:
#   - /usr/bin/nsqd --version and /usr/bin/nsqlookupd --version run;
#   - the units (which `systemd-analyze verify` accepts), /etc/nsqd/nsqd.cfg (a
#     conffile), /var/lib/nsqd (owned by nsqd) and the users nsqd and nsqlookupd exist;
#   - the preflight passes as user nsqd on /var/lib/nsqd (nsqd --preflight), or, when
#     systemd started the service, /ping answers on 4151;
#   - after `dpkg --purge` the binaries, the config and the data directory are gone.
# Needs root and dpkg (Debian, Ubuntu). CI runs it after scripts/test.sh (.ci/run); it
# installs a system package, so scripts/test.sh does not run it on developer machines.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]] || ! command -v dpkg >/dev/null; then
  echo "SKIP: needs root and dpkg"; exit 0
fi
if dpkg -s nsqd-rs >/dev/null 2>&1; then
  echo "SKIP: nsqd-rs is already installed on this machine; not touching it"; exit 0
fi
if ! command -v cargo-deb >/dev/null && [[ ! -x $HOME/.cargo/bin/cargo-deb ]]; then
  echo "== installing cargo-deb"
  cargo install cargo-deb --locked --quiet
fi
export PATH="$HOME/.cargo/bin:$PATH"

# cargo-deb builds the root package (nsqd); nsqlookupd is its own package (lookupd/), so
# build both first: the asset target/release/nsqlookupd must exist.
echo "== cargo build --release -p nsqd -p nsqlookupd"
cargo build --release -p nsqd -p nsqlookupd || { echo "FAIL: cargo build"; exit 1; }
echo "== cargo deb --strip"
out=$(cargo deb --strip 2>&1) || { echo "$out"; echo "FAIL: cargo deb"; exit 1; }
DEB=$(printf '%s\n' "$out" | grep '\.deb$' | tail -1)
[[ -f $DEB ]] || { echo "$out"; echo "FAIL: cargo deb produced no package"; exit 1; }
echo "$DEB"
dpkg-deb --info "$DEB" | sed -n '/Package:/,$p'
dpkg-deb --contents "$DEB"

fail=0
check() { if "$@" >/dev/null 2>&1; then echo "ok: $*"; else echo "FAIL: $*"; fail=1; fi; }
cleanup() {
  echo "== dpkg --purge nsqd-rs"
  dpkg --purge nsqd-rs >/dev/null || { echo "FAIL: dpkg --purge"; fail=1; }
}
trap cleanup EXIT

if [[ -e /var/lib/nsqd ]]; then
  echo "note: /var/lib/nsqd exists before the install:"; ls -la /var/lib/nsqd
fi
echo "== dpkg -i"
dpkg -i "$DEB"
check test -x /usr/bin/nsqd
check test -x /usr/bin/nsqlookupd
check /usr/bin/nsqd --version
check /usr/bin/nsqlookupd --version
/usr/bin/nsqd --version
check test -f /lib/systemd/system/nsqd.service -o -f /usr/lib/systemd/system/nsqd.service
check test -f /lib/systemd/system/nsqlookupd.service -o -f /usr/lib/systemd/system/nsqlookupd.service
if command -v systemd-analyze >/dev/null; then
  for u in nsqd nsqlookupd; do
    unit=$(ls /usr/lib/systemd/system/$u.service /lib/systemd/system/$u.service 2>/dev/null | head -1)
    if out=$(systemd-analyze verify "$unit" 2>&1) && [[ -z $out ]]; then
      echo "ok: systemd-analyze verify $unit"
    else
      echo "FAIL: systemd-analyze verify $unit: $out"; fail=1
    fi
  done
fi
check grep -qx /etc/nsqd/nsqd.cfg /var/lib/dpkg/info/nsqd-rs.conffiles
check getent passwd nsqd
check getent passwd nsqlookupd
check test "$(stat -c %U /var/lib/nsqd)" = nsqd
if [[ -d /run/systemd/system ]] && systemctl is-active --quiet nsqd; then
  echo "== nsqd.service is running; GET /ping"
  check curl -fsS http://127.0.0.1:4151/ping
else
  echo "== preflight as user nsqd"
  if setpriv --reuid=nsqd --regid=nsqd --init-groups \
      /usr/bin/nsqd --preflight --data-path=/var/lib/nsqd \
      --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0; then
    echo "ok: nsqd --preflight as nsqd"
  else
    echo "FAIL: nsqd --preflight as nsqd"; fail=1
    id nsqd; ls -la /var/lib/nsqd; stat /var/lib /var/lib/nsqd
    echo "pid 1: $(ps -p 1 -o comm= 2>/dev/null)"; mount | grep -E ' / | /var' || true
  fi
fi

trap - EXIT
cleanup
check test ! -e /usr/bin/nsqd
check test ! -e /etc/nsqd/nsqd.cfg
check test ! -e /var/lib/nsqd
if [[ $fail == 0 ]]; then echo "PASS: Debian package"; else echo "FAIL: Debian package"; fi
exit $fail
