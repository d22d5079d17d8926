"""The `--to-topic` self-feed guard follows the subject a record has on its way into the followed
stream: a mirror's or source's filter_subject and subject transforms, and a stream's own
subject_transform. Real nats-server streams.

The old guard looked only at stream names and the followed URL's subject as typed: it refused a
copy into a subject the followed stream's source filters out, and it let through a loop whose
records reach the followed subject under another name (a transform)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import MakeStream, follow_copy, made_streams, produce, refused_as_loop, values


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "h-guard") as make:
        yield make


@pytest.mark.integration
@pytest.mark.parametrize("how", ["filter_subject", "subject_transforms"])
def test_a_subject_the_source_filters_out_is_no_loop(
    nats_url: str, stream: MakeStream, tmp_path: Path, how: str
) -> None:
    """AGG sources only ORIG.a of ORIG: following AGG while copying into ORIG.b is a plain copy
    (the old guard refused it: ORIG is a source of AGG). Into ORIG.a it is a loop."""
    from nats.js.api import StreamSource, SubjectTransform

    orig = stream(subjects=["{name}.a", "{name}.b"])
    if how == "filter_subject":
        src = StreamSource(name=orig, filter_subject=f"{orig}.a")
    else:  # a transform that keeps the subject: its source is the filter
        src = StreamSource(
            name=orig, subject_transforms=[SubjectTransform(src=f"{orig}.a", dest=f"{orig}.a")]
        )
    agg = stream(subjects=[], sources=[src])
    produce(f"{nats_url}/{orig}/{orig}.a", b"1\n2\n")
    r = follow_copy(f"{nats_url}/{agg}", f"{nats_url}/{orig}/{orig}.b", tmp_path)
    assert r.returncode == 0, r.stderr  # was: refused, exit 2
    assert values(f"{nats_url}/{orig}/{orig}.b") == [b"1", b"2"]
    assert refused_as_loop(follow_copy(f"{nats_url}/{agg}", f"{nats_url}/{orig}/{orig}.a", tmp_path))


@pytest.mark.integration
def test_a_loop_through_the_streams_own_subject_transform_isrefused_as_loop(
    nats_url: str, stream: MakeStream, tmp_path: Path
) -> None:
    """EV stores what is published to EV.in as EV.out: following EV/EV.out while copying into
    EV/EV.in reads every copy back (the old guard compared EV.out with EV.in: 20 copies, exit 0)."""
    from nats.js.api import SubjectTransform

    ev = stream(
        subjects=["{name}.in"], subject_transform=SubjectTransform(src="*.in", dest="{{wildcard(1)}}.out")
    )
    produce(f"{nats_url}/{ev}/{ev}.in", b"1\n")
    assert values(f"{nats_url}/{ev}/{ev}.out") == [b"1"]
    r = follow_copy(f"{nats_url}/{ev}/{ev}.out", f"{nats_url}/{ev}/{ev}.in", tmp_path)
    assert refused_as_loop(r), r.stderr
    assert values(f"{nats_url}/{ev}") == [b"1"]  # nothing was copied


@pytest.mark.integration
def test_a_loop_through_a_source_transform_isrefused_as_loop(
    nats_url: str, stream: MakeStream, tmp_path: Path
) -> None:
    """AGG sources ORIG.a as AGG.got.a: following AGG/AGG.got.a while copying into ORIG/ORIG.a is
    a loop (missed by the old guard), copying into ORIG/ORIG.b is not."""
    from nats.js.api import StreamSource, SubjectTransform

    orig = stream(subjects=["{name}.*"])
    moved = SubjectTransform(src=f"{orig}.*", dest="agg.got.$1")
    agg = stream(subjects=[], sources=[StreamSource(name=orig, subject_transforms=[moved])])
    produce(f"{nats_url}/{orig}/{orig}.a", b"1\n")
    followed = f"{nats_url}/{agg}/agg.got.a"
    r = follow_copy(followed, f"{nats_url}/{orig}/{orig}.a", tmp_path)
    assert refused_as_loop(r), r.stderr
    assert values(f"{nats_url}/{orig}") == [b"1"]  # nothing was copied
    r = follow_copy(followed, f"{nats_url}/{orig}/{orig}.b", tmp_path)
    assert r.returncode == 0, r.stderr


def test_subject_transforms_as_nats_server_applies_them() -> None:
    from topics.sources.subjects import subjects_overlap, transformed

    assert transformed("a.*", "b.{{wildcard(1)}}", "a.x") == ["b.x"]
    assert transformed("a.*.>", "b.$1.>", "a.x.y.z") == ["b.x.y.z"]
    assert transformed("a.*", "", "a.x") == ["a.x"]  # a filter only
    assert transformed("a.b", "c", "a.c") == []
    # a function rq does not work out: the result may be anything
    assert transformed("a.*", "{{partition(3,1)}}.a", "a.x") == [">"]
    assert subjects_overlap("a.*", "a.b") and subjects_overlap("*.b", "a.>")
    assert not subjects_overlap("a.>", "a") and not subjects_overlap("a.b", "a.c")
