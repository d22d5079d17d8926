#!/usr/bin/env bash
# Send a small fake checkpoint over QUIC on loopback with `rq send`, received by `rq recv --once`,
# pinned by the certificate fingerprint recv prints; then check every file's sha256 on both sides.
set -euo pipefail
W="$QS_WORK/transfer"
mkdir -p "$W/src/ckpt/shards" "$W/dst"
python3 - "$W/src/ckpt" <<'PY'
import json, os, sys
import numpy as np
root = sys.argv[1]
rng = np.random.default_rng(0)
w = (rng.standard_normal(1_000_000).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
w.tofile(f"{root}/shards/model-00001.bf16")              # bf16 weights: compress to ~0.68
with open(f"{root}/shards/optimizer.bin", "wb") as f:
    f.write(os.urandom(1_500_000))                       # random: sent raw by --compress auto
json.dump({"shards": ["model-00001.bf16", "optimizer.bin"]}, open(f"{root}/index.json", "w"))
PY
export RQ_TOKEN="quickstart-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
rq recv "$W/dst" --listen 127.0.0.1:0 --transport quic --once --json --cert-dir "$W/cert" >"$W/recv.out" 2>"$W/recv.err" &
RECV_PID=$!
trap 'kill $RECV_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$W/recv.out" ] && break; sleep 0.1; done
LINE=$(head -n1 "$W/recv.out")
ADDR=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["address"])' "$LINE")
PIN=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pin"])' "$LINE")
echo "rq recv says: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["send"])' "$LINE")"
rq send "$W/src/ckpt" "rq://$ADDR" --transport quic --pin "$PIN" --connections 1
for _ in $(seq 50); do kill -0 "$RECV_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$RECV_PID" 2>/dev/null; then echo "rq recv --once did not exit"; exit 1; fi
wait "$RECV_PID" || { echo "rq recv failed:"; cat "$W/recv.err"; exit 1; }
(cd "$W/src" && find ckpt -type f -exec sha256sum {} + | sort) >"$W/src.sha"
(cd "$W/dst" && find ckpt -type f -exec sha256sum {} + | sort) >"$W/dst.sha"
diff "$W/src.sha" "$W/dst.sha"
echo "checkpoint arrived intact: $(wc -l <"$W/dst.sha") files, sha256 identical"
