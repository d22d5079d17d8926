# Shared by scripts/test.sh and scripts/quickstart.sh: set up .venv and the optional system packages.
# shellcheck shell=bash

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_venv() {
  local py=${PYTHON:-python3}
  if [ ! -x "$REPO/.venv/bin/python" ]; then
    say "creating .venv with $($py --version 2>&1)"
    "$py" -m venv "$REPO/.venv"
  fi
  # Re-install only when pyproject.toml changed since the last install (saves ~10 s a run). The
  # stamp's name changes with the way rq is installed, so an older .venv is installed again.
  local stamp="$REPO/.venv/.rq-installed-compat"
  if [ ! -f "$stamp" ] || [ "$REPO/pyproject.toml" -nt "$stamp" ]; then
    say "installing rq and its dev tools into .venv"
    # compat: the checkout goes on sys.path through a .pth, so its packages are regular packages
    # found in path order. setuptools' default finder for this flat layout loses to any `cache/`,
    # `topics/` or `transfer/` folder in the working directory or on pytest's path (tests/cache):
    # `from cache import Cache` then fails with "unknown location", and so did plain `pytest`.
    "$REPO/.venv/bin/python" -m pip install -q --disable-pip-version-check \
      --config-settings editable_mode=compat -e "$REPO[dev]" 2>&1 \
      | grep -v -e '^WARNING: Location' -e 'is ignored: it is neither' >&2 || true
    "$REPO/.venv/bin/python" -c "import rqcli, cache, transfer, topics" || { say "install failed"; return 1; }
    touch "$stamp"
  fi
  # An editable install is never byte-compiled, and where PYTHONDONTWRITEBYTECODE is set Python
  # would compile rq's modules from source on every run (~30 ms of each `rq` start, measured): do
  # it once here, as pip does for a wheel. Only stale files are rewritten.
  "$REPO/.venv/bin/python" -m compileall -q "$REPO/rqcli" "$REPO/cache" "$REPO/transfer" "$REPO/topics" >/dev/null || true
  export PATH="$REPO/.venv/bin:$PATH"
}

# Debian packages that make more of the suite run (Mosquitto for MQTT, iperf3/rclone as bench peers,
# iproute2 for the netns fault tests). Optional: without root or apt they are skipped with a message.
ensure_system_packages() {
  local missing=()
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v tc >/dev/null || missing+=(iproute2)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "optional packages missing (${missing[*]}): not root or no apt-get; their tests will be skipped"
    return 0
  fi
  say "installing optional Debian packages: ${missing[*]}"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1; then
    say "apt-get install ${missing[*]} failed; their tests will be skipped"
  fi
  # Debian starts a system mosquitto on :1883; ours runs on its own port, so that one is left alone.
  return 0
}

# Starts the services (all, or those named); sets RQ_STARTED_SERVICES to the names of those this
# call started, even when a later one failed, so the caller stops exactly those: services that were
# already running (a user's own S3 or NATS) are left running.
start_services() {
  local out rc=0
  out=$(bash "$REPO/scripts/services.sh" start "$@") || rc=$?
  printf '%s\n' "$out" >&2
  RQ_STARTED_SERVICES=$(sed -n 's/^\([a-z]*\) started$/\1/p' <<<"$out" | tr '\n' ' ')
  RQ_STARTED_SERVICES=${RQ_STARTED_SERVICES% }
  export RQ_STARTED_SERVICES
  return $rc
}

stop_services_if_started() {
  if [ -n "${RQ_STARTED_SERVICES:-}" ]; then
    # shellcheck disable=SC2086  # a list of plain names
    bash "$REPO/scripts/services.sh" stop $RQ_STARTED_SERVICES >&2 || true
    RQ_STARTED_SERVICES=
  fi
}
