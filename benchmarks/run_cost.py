"""The fixed cost of a maintenance run launched from the UI, per job and per asset.

The UI's run launcher starts a fresh process per run, which loads the code location, starts Spark when a
step first needs it, and runs the job's steps in that one process (in_process_executor). Each run here is
such a process: `dagster job execute -m assets.definitions -j JOB` (the module workspace.yaml names), on
an embedded store holding the traffic, mailboxes, faults and generations of `mailq demo` (a small
one, before the demo's own pipeline runs), recorded in a temporary instance whose event log
splits the run:

  start    the process's start to the run's start: the interpreter, imports, the code location, the run;
  steps    each step's seconds (the first Spark step pays for the session's start);
  end      the last step to the process's exit: Spark's stop, the run's end.

Measured in the same run, the floors the launcher cannot go below: `import assets.definitions` in a fresh
process, and a bare Spark session (same settings) started, asked `range(1).count()`, stopped. Medians of
`--repeat` runs per job. Prints human lines, then one JSON object as the last line.

    .venv/bin/python benchmarks/run_cost.py [--mails 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from harness import REPOSITORY, data_dir
from quick import parse_args

from mailq_cli import demo

JOBS = (
    "queue_overview_job",
    "dead_letters_job",
    "queue_cleanup_job",
    "mailbox_counters_job",
    "blob_gc_job",
    "orphan_sweep_job",
    "maintenance_job",
)
PYTHON = sys.executable
SPARK_FLOOR = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from resources.spark import spark_config
builder = SparkSession.builder
for key, value in spark_config().items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.range(1).count()
spark.stop()
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=REPOSITORY, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def run_once(job: str, env: dict[str, str], home: Path) -> dict:
    """One run of `job` in a fresh process; its phases in seconds, from the instance's event log."""
    started_at = time.time()
    total = timed(
        [str(Path(PYTHON).with_name("dagster")), "job", "execute", "-m", "assets.definitions", "-j", job], env
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (record,) = instance.get_run_records(dg.RunsFilter(job_name=job), limit=1)
        events = instance.all_logs(record.dagster_run.run_id)
    assert record.dagster_run.is_success, f"{job} failed"

    def times(kind: dg.DagsterEventType) -> dict[str | None, float]:
        return {
            e.step_key: e.timestamp for e in events if e.dagster_event and e.dagster_event.event_type == kind
        }

    starts, ends = times(dg.DagsterEventType.STEP_START), times(dg.DagsterEventType.STEP_SUCCESS)
    (run_start,) = times(dg.DagsterEventType.RUN_START).values()
    last_end = max(ends.values())
    return {
        "total": total,
        "start": run_start - started_at,
        "steps": {key: ends[key] - starts[key] for key in starts},
        "end": started_at + total - last_end,
    }


def medians(runs: list[dict]) -> dict:
    return {
        "total": round(statistics.median(r["total"] for r in runs), 2),
        "start": round(statistics.median(r["start"] for r in runs), 2),
        "end": round(statistics.median(r["end"] for r in runs), 2),
        "steps": {
            key: round(statistics.median(r["steps"][key] for r in runs), 2) for key in runs[0]["steps"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS), help="the jobs run, comma-separated (default: all)")
    args = parse_args(parser, {"mails": 20, "repeat": 1, "jobs": JOBS[0]})
    jobs = args.jobs.split(",")
    with data_dir("run-cost") as store, tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "DAGSTER_HOME": home,
            "MAILQ_URL": f"embedded://{store}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": PYTHON,
        }
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        demo.seed(demo.embedded(store, args.mails), args.mails, say=lambda _: None)
        floors = {"import_code_location": [], "spark_session": []}
        results: dict[str, list[dict]] = {job: [] for job in jobs}
        for _ in range(args.repeat):  # interleaved: the machine's drift lands on every job alike
            floors["import_code_location"].append(timed([PYTHON, "-c", "import assets.definitions"], env))
            floors["spark_session"].append(timed([PYTHON, "-c", SPARK_FLOOR], env))
            for job in jobs:
                results[job].append(run_once(job, env, Path(home)))
    floor = {name: round(statistics.median(values), 2) for name, values in floors.items()}
    summary = {job: medians(runs) for job, runs in results.items()}
    for name, seconds in floor.items():
        print(f"floor {name:<22} {seconds:6.2f} s")
    for job, figures in summary.items():
        steps = ", ".join(f"{key} {value}" for key, value in figures["steps"].items())
        print(f"{job:<22} {figures['total']:6.2f} s: start {figures['start']}, {steps}, end {figures['end']}")
    print(json.dumps({"mails": args.mails, "repeat": args.repeat, "floors": floor, "jobs": summary}))


if __name__ == "__main__":
    main()
