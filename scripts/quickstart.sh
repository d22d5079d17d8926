#!/usr/bin/env bash
# The main job on a fresh machine: starts a local SeaweedFS S3 and NATS, then runs each part in
# scripts/quickstart.d/ (doctor, preload a dataset, send a checkpoint over QUIC on loopback, replay a
# topic). Stops the servers it started and removes its scratch directory, whatever happens.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"

ensure_venv || exit 1
start_services || { stop_services_if_started; exit 1; }
QS_WORK=$(mktemp -d "${TMPDIR:-/tmp}/rq-quickstart.XXXXXX")
export QS_WORK
cleanup() {
  rm -rf "$QS_WORK"
  stop_services_if_started
}
trap cleanup EXIT

# shellcheck disable=SC1091
source "${RQ_SERVICES_DIR:-$REPO/.rq-services}/services.env"  # where scripts/services.sh wrote it
export AWS_ACCESS_KEY_ID=$RQ_TEST_AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$RQ_TEST_AWS_SECRET_ACCESS_KEY
export AWS_ENDPOINT_URL=$RQ_TEST_S3_ENDPOINT AWS_DEFAULT_REGION=us-east-1
unset AWS_PROFILE
export RQ_NATS_URL=$RQ_TEST_NATS_URL
# Keep the quickstart's cache and topics out of the user's real ones.
export RQ_CACHE_DIR=$QS_WORK/cache RQ_TOPICS_DIR=$QS_WORK/topics

for part in "$REPO"/scripts/quickstart.d/*.sh; do
  say "quickstart: $(basename "$part")"
  if ! bash "$part"; then
    say "quickstart FAILED in $(basename "$part")"
    exit 1
  fi
done
say "quickstart finished: every step verified"
