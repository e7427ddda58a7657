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
