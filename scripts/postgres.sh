#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on loopback only.
#
#   bash scripts/postgres.sh start   # prints the DSN as the last line of stdout
#   bash scripts/postgres.sh stop    # stops the server and removes its directory
#
# The server lives in $TRIO_BACKPLANE_PG_DIR (default /tmp/trio_backplane_pg):
# data directory, log, Unix socket and the chosen port.  It listens on
# 127.0.0.1 only, with `trust` authentication for loopback connections, on the
# first free port from $TRIO_BACKPLANE_PG_PORT (default 54329).  Run as root,
# the server runs as the `postgres` OS user (PostgreSQL refuses to run as
# root), which is why the directory is under /tmp and not in the checkout.
# Durability is off (fsync=off): the server is thrown away after the tests.
#
# `start` is idempotent: when the server in that directory is already up it
# prints the same DSN again.  `stop` is idempotent too.  Progress goes to
# stderr; stdout carries only the DSN.
set -euo pipefail

BASE="${TRIO_BACKPLANE_PG_DIR:-/tmp/trio_backplane_pg}"
FIRST_PORT="${TRIO_BACKPLANE_PG_PORT:-54329}"
DATABASE="${TRIO_BACKPLANE_PG_DATABASE:-backplane}"
DATA="$BASE/data"
LOG="$BASE/server.log"
PORT_FILE="$BASE/port"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$BASE" in
  /*) ;;
  *) die "TRIO_BACKPLANE_PG_DIR must be an absolute path (got '$BASE')" ;;
esac

# Tools run as the server's owner never need the (possibly unreadable) checkout.
cd /

# A directory holding every server tool we use.
complete_bindir() {
  local tool
  for tool in initdb pg_ctl pg_isready postgres psql createdb; do
    [[ -x "$1/$tool" ]] || return 1
  done
}

find_bindir() {
  local candidate
  # initdb on PATH (resolving symlinks such as /usr/local/bin/initdb), then
  # pg_config, then the newest Debian/Ubuntu versioned directory.
  if candidate="$(command -v initdb 2>/dev/null)" && [[ -n "$candidate" ]]; then
    candidate="$(dirname "$(readlink -f "$candidate")")"
    if complete_bindir "$candidate"; then
      printf '%s\n' "$candidate"
      return 0
    fi
  fi
  if command -v pg_config >/dev/null 2>&1; then
    candidate="$(pg_config --bindir 2>/dev/null || true)"
    if [[ -n "$candidate" ]] && complete_bindir "$candidate"; then
      printf '%s\n' "$candidate"
      return 0
    fi
  fi
  for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    if complete_bindir "$candidate"; then
      printf '%s\n' "$candidate"
      return 0
    fi
  done
  return 1
}

BINDIR=""
require_binaries() {
  if BINDIR="$(find_bindir)"; then
    return 0
  fi
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "initdb not found: installing PostgreSQL with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    if BINDIR="$(find_bindir)"; then
      return 0
    fi
  fi
  die "PostgreSQL server binaries (initdb) not found; install PostgreSQL (apt-get install postgresql)"
}

# as_owner CMD...: run CMD as the server's owner (postgres when we are root).
as_owner() {
  if [[ "$(id -u)" -ne 0 ]]; then
    "$@"
  elif command -v runuser >/dev/null 2>&1; then
    runuser -u postgres -- "$@"
  else
    su postgres -s /bin/sh -c '"$0" "$@"' -- "$@"
  fi
}

ensure_owner_account() {
  if [[ "$(id -u)" -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
    log "creating the postgres system user"
    useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/sh postgres
  fi
}

port_in_use() {
  # A successful connect means something listens there.
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

is_running() {
  [[ -f "$DATA/PG_VERSION" && -f "$PORT_FILE" ]] || return 1
  as_owner "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1 || return 1
  "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$(cat "$PORT_FILE")" -t 2
}

dsn() {
  printf 'postgresql://postgres@127.0.0.1:%s/%s\n' "$(cat "$PORT_FILE")" "$DATABASE"
}

ensure_database() {
  local port exists
  port="$(cat "$PORT_FILE")"
  exists="$("$BINDIR/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -XAtq \
    -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")"
  if [[ "$exists" != "1" ]]; then
    "$BINDIR/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DATABASE"
  fi
}

stop_server() {
  if [[ -f "$DATA/postmaster.pid" ]]; then
    as_owner "$BINDIR/pg_ctl" -D "$DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
  fi
}

start() {
  require_binaries
  ensure_owner_account
  if is_running; then
    log "already running in $BASE"
    ensure_database
    dsn
    return 0
  fi
  # Whatever is left (a crashed or half-made server) is thrown away.
  if [[ -d "$BASE" ]]; then
    stop_server
    rm -rf "$BASE"
  fi
  mkdir -p "$BASE"
  chmod 700 "$BASE"
  if [[ "$(id -u)" -eq 0 ]]; then
    chown postgres:postgres "$BASE"
  fi

  log "initdb in $DATA ($BINDIR)"
  as_owner "$BINDIR/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C \
    --no-sync --no-instructions >"$BASE/initdb.log" 2>&1 \
    || { cat "$BASE/initdb.log" >&2; die "initdb failed"; }
  # Loopback only, trust: nothing else may connect.
  as_owner sh -c "cat > '$DATA/pg_hba.conf'" <<'EOF'
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
EOF

  local port="$FIRST_PORT" attempt
  for attempt in $(seq 1 50); do
    while port_in_use "$port"; do
      port=$((port + 1))
    done
    as_owner sh -c "echo $port > '$PORT_FILE'"
    if as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w -t 15 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k '$BASE' -c fsync=off \
          -c full_page_writes=off -c synchronous_commit=off -c max_connections=200" \
      start >/dev/null 2>&1; then
      break
    fi
    log "could not start on port $port (attempt $attempt); log tail:"
    tail -n 5 "$LOG" >&2 || true
    stop_server
    port=$((port + 1))
    [[ "$attempt" -lt 50 ]] || die "PostgreSQL did not start"
  done

  local waited
  for waited in $(seq 1 150); do
    if "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1; then
      break
    fi
    [[ "$waited" -lt 150 ]] || { tail -n 20 "$LOG" >&2 || true; die "pg_isready timed out"; }
    sleep 0.1
  done
  ensure_database
  log "PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($BASE)"
  dsn
}

stop() {
  if [[ ! -e "$BASE" ]]; then
    log "nothing to stop in $BASE"
    return 0
  fi
  if BINDIR="$(find_bindir)"; then
    stop_server
  fi
  rm -rf "$BASE"
  log "stopped and removed $BASE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
