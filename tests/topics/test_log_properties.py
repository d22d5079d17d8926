"""Properties of the embedded log format: any records round-trip; any single flipped byte is either
caught or harmless — a reader never returns a record that differs from what was written."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicLog
from topics.errors import CorruptRecord

records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=12),
        st.lists(st.tuples(st.text(min_size=1, max_size=6), st.binary(max_size=8)), max_size=3).map(tuple),
        st.binary(max_size=64),
    ),
    min_size=1,
    max_size=30,
)


@given(records)
def test_batches_roundtrip(recs: list) -> None:
    data = fmt.encode_batch(7, [(None, k, h, v) for k, h, v in recs], [1000 + i for i in range(len(recs))])
    hdr = fmt.read_batch_header(data, 0)
    assert hdr is not None and (hdr.base, hdr.count) == (7, len(recs))
    out = fmt.decode_records(data, fmt.BATCH_SIZE, len(data))
    assert [(r[2], r[3], r[4]) for r in out] == [(k, h, v) for k, h, v in recs]
    assert [r[0] for r in out] == list(range(7, 7 + len(recs)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, records, st.integers(min_value=0), st.integers(min_value=0, max_value=7))
def test_a_flipped_byte_never_yields_a_wrong_record(first: list, second: list, where: int, bit: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        topic = Path(tmp) / "t"
        written: dict[int, tuple] = {}
        with LogWriter(topic) as w:
            for batch in (first, second, first):
                a, _ = w.append([(None, k, h, v) for k, h, v in batch])
                for i, (k, h, v) in enumerate(batch):
                    written[a + i] = (k, h, v)
        seg = topic / fmt.segment_name(0)
        data = bytearray(seg.read_bytes())
        data[where % len(data)] ^= 1 << bit
        seg.write_bytes(bytes(data))
        got: list[tuple] = []
        try:
            for b in TopicLog(topic).reader(0):
                got.extend(b)
        except CorruptRecord as exc:
            assert exc.offset in written
        for off, _ts, k, h, v in got:
            assert written[off] == (k, h, v)  # whatever is served is exactly what was written
        skipped = [r for b in TopicLog(topic).reader(0, skip_corrupt=True) for r in b]
        for off, _ts, k, h, v in skipped:
            assert written[off] == (k, h, v)
        assert len(skipped) >= len(written) - max(len(first), len(second))  # one batch at most is lost
