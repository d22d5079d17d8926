#!/usr/bin/env bash
# Preload: seed 50 small objects into the local SeaweedFS, preload them into the tiered cache, show
# what landed (rq cache du / ls), re-run to show that nothing is fetched twice, and verify every entry.
set -euo pipefail
BUCKET=rq-quickstart-preload
ram_dir() { readlink "$RQ_CACHE_DIR/ram" 2>/dev/null || true; }
trap 'd=$(ram_dir); [ -n "$d" ] && rm -rf -- "$d"' EXIT

python - "$BUCKET" <<'PY'
import hashlib, sys
import boto3
bucket = sys.argv[1]
s3 = boto3.client("s3")
try:
    s3.create_bucket(Bucket=bucket)
except s3.exceptions.ClientError as exc:
    if "BucketAlready" not in str(exc):
        raise
for i in range(50):
    body = hashlib.sha256(str(i).encode()).digest() * 2048  # 64 KiB each
    s3.put_object(Bucket=bucket, Key=f"train/{i:04d}.bin", Body=body)
print(f"seeded 50 objects into s3://{bucket}/train/")
PY

rq preload "s3://$BUCKET/train/" --tier ram --ram-limit 64M
rq cache du
rq cache ls "s3://$BUCKET/train/000*"
again=$(rq preload "s3://$BUCKET/train/" --tier ram --json)
echo "$again"
python -c 'import json,sys; s=json.loads(sys.argv[1]); assert s["objects"]==0 and s["skipped"]==50, s' "$again"
rq cache verify
python - "$BUCKET" <<'PY'
import hashlib, sys
from cache import Cache
c = Cache()
with c.open(f"s3://{sys.argv[1]}/train/0007.bin") as fh:
    assert fh.read() == hashlib.sha256(b"7").digest() * 2048
print("Cache.open read back object 7: verified")
PY
