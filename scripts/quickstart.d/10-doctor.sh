#!/usr/bin/env bash
# What this machine can do, checked against the services the quickstart started.
set -euo pipefail
rq doctor --endpoint-url "$AWS_ENDPOINT_URL" --nats-url "$RQ_NATS_URL"
