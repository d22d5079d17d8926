#!/usr/bin/env bash
# Topics: produce a few multimodal samples into the embedded log, replay a range with --where and
# --fields, pin it with --save-spec and replay it exactly by spec; then the same against JetStream.
set -euo pipefail
W=$QS_WORK/topics-part
mkdir -p "$W"
export RQ_TOPICS_DIR=${RQ_TOPICS_DIR:-$QS_WORK/topics}

cat > "$W/samples.jsonl" <<'JSONL'
{"id":"s0","image":{"uri":"s3://ds/img/0.png","w":640},"audio":{"uri":"s3://ds/aud/0.wav"},"metadata":{"quality_score":0.95,"source":"crawl"},"tags":["edge-case"]}
{"id":"s1","image":{"uri":"s3://ds/img/1.png","w":640},"audio":{"uri":"s3://ds/aud/1.wav"},"metadata":{"quality_score":0.42,"source":"crawl"},"tags":["edge-case"]}
{"id":"s2","image":{"uri":"s3://ds/img/2.png","w":320},"audio":{"uri":"s3://ds/aud/2.wav"},"metadata":{"quality_score":0.97,"source":"synthetic"},"tags":["night"]}
{"id":"s3","image":{"uri":"s3://ds/img/3.png","w":640},"audio":{"uri":"s3://ds/aud/3.wav"},"metadata":{"quality_score":0.93,"source":"crawl"},"tags":["edge-case","night"]}
{"id":"s4","image":{"uri":"s3://ds/img/4.png","w":640},"audio":{"uri":"s3://ds/aud/4.wav"},"metadata":{"quality_score":0.99,"source":"crawl"},"tags":["edge-case"]}
JSONL

rq produce samples --key camera-1 < "$W/samples.jsonl"
rq offsets samples

echo "--- replay offsets 1..4, good edge cases only, image + score kept, audio dropped:"
rq replay samples --from 1:5 \
  --where 'metadata.quality_score > 0.9 and "edge-case" in tags' \
  --fields id,image,metadata.quality_score --format json --save-spec "$W/run.json" | tee "$W/first.jsonl"
test "$(wc -l < "$W/first.jsonl")" -eq 2
grep -q '"id":"s3"' "$W/first.jsonl" && grep -q '"id":"s4"' "$W/first.jsonl"
if grep -q audio "$W/first.jsonl"; then echo "audio should have been dropped" >&2; exit 1; fi

echo "--- the saved spec pins exact offsets and a digest:"
cat "$W/run.json"
echo '{"id":"s5","metadata":{"quality_score":1.0},"tags":["edge-case"]}' | rq produce samples -q
rq replay --spec "$W/run.json" --format json > "$W/again.jsonl"
cmp "$W/first.jsonl" "$W/again.jsonl"

echo "--- a template, and a consumer group that commits:"
rq replay samples --group trainer --count 3 --commit --format '{offset} {value.id} q={value.metadata.quality_score}'
rq offsets samples --group trainer

if [ -n "${RQ_NATS_URL:-}" ]; then
  STREAM="QS_$$"
  echo "--- the same samples through JetStream ($RQ_NATS_URL/$STREAM):"
  rq produce "$RQ_NATS_URL/$STREAM/$STREAM.samples" -q < "$W/samples.jsonl"
  rq replay "$RQ_NATS_URL/$STREAM" --from 2:4 --format '{offset} {key} {value.id}' | tee "$W/js.txt"
  test "$(wc -l < "$W/js.txt")" -eq 2
  rq offsets "$RQ_NATS_URL/$STREAM"
  python - "$RQ_NATS_URL" "$STREAM" <<'PY'
import asyncio, sys, nats
async def drop():
    nc = await nats.connect(sys.argv[1])
    await nc.jetstream().delete_stream(sys.argv[2])
    await nc.close()
asyncio.run(drop())
PY
fi
echo "topics: ok"
