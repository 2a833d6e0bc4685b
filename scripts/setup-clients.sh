#!/usr/bin/env bash
# Installs the real NSQ client libraries that scripts/clients/*_scenario.* drive:
#   - .venv/ (repo root): pynsq + gnsq, pinned in scripts/clients/requirements.txt
#   - scripts/clients/node_modules/: nsqjs, pinned in scripts/clients/package.json
#     (+ package-lock.json)
# Idempotent: a stamp file records a hash of the pin files; when it matches and the
# libraries import, nothing is downloaded. Needs python3 (>= 3.8, with venv) and
# node/npm (>= 18) on PATH; override the interpreter with PYTHON=/path/to/python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLIENTS="$ROOT/scripts/clients"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

log() { echo "[setup-clients] $*" >&2; }
die() { echo "[setup-clients] ERROR: $*" >&2; exit 1; }

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# ---------------------------------------------------------------- python clients
setup_python() {
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (install python3 + python3-venv)"
  local want stamp="$VENV/.clients-stamp"
  want="$(hash_of "$CLIENTS/requirements.txt" "$CLIENTS/build-requirements.txt")"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     "$VENV/bin/python" -c 'import nsq, gnsq, tornado, gevent' >/dev/null 2>&1; then
    log "python venv up to date ($VENV)"
    return
  fi
  if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv?)"
  fi
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q)
  log "installing build tools"
  "${pip[@]}" install -r "$CLIENTS/build-requirements.txt"
  log "installing python clients (pynsq, gnsq)"
  # --no-build-isolation: pynsq's sdist is built with the pinned setuptools above.
  "${pip[@]}" install --no-build-isolation -r "$CLIENTS/requirements.txt"
  "$VENV/bin/python" - <<'EOF' || die "python clients do not import"
import nsq, gnsq, tornado, gevent
print("[setup-clients] pynsq %s, gnsq %s, tornado %s, gevent %s"
      % (nsq.__version__, gnsq.__version__, tornado.version, gevent.__version__))
EOF
  echo "$want" >"$stamp"
}

# ---------------------------------------------------------------- node client
setup_node() {
  command -v node >/dev/null 2>&1 || die "node not found (install nodejs >= 18)"
  command -v npm >/dev/null 2>&1 || die "npm not found (install npm)"
  local files=("$CLIENTS/package.json")
  [[ -f "$CLIENTS/package-lock.json" ]] && files+=("$CLIENTS/package-lock.json")
  local want stamp="$CLIENTS/node_modules/.clients-stamp"
  want="$(hash_of "${files[@]}")"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     (cd "$CLIENTS" && node -e 'require("nsqjs")') >/dev/null 2>&1; then
    log "node_modules up to date ($CLIENTS/node_modules)"
    return
  fi
  log "installing nsqjs with npm $(npm --version) (node $(node --version))"
  if [[ -f "$CLIENTS/package-lock.json" ]]; then
    (cd "$CLIENTS" && npm ci --no-audit --no-fund --loglevel=error)
  else
    (cd "$CLIENTS" && npm install --no-audit --no-fund --loglevel=error)
  fi
  (cd "$CLIENTS" && node -e '
    const v = require("nsqjs/package.json").version;
    require("nsqjs");
    console.error("[setup-clients] nsqjs " + v);') || die "nsqjs does not load"
  # The lock file may have been (re)written by npm install: hash what is there now.
  files=("$CLIENTS/package.json")
  [[ -f "$CLIENTS/package-lock.json" ]] && files+=("$CLIENTS/package-lock.json")
  hash_of "${files[@]}" >"$stamp"
}

case "${1:-all}" in
  python) setup_python ;;
  node) setup_node ;;
  all) setup_python; setup_node ;;
  *) die "usage: $0 [all|python|node]" ;;
esac
log "done"
