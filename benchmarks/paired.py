"""A change's effect on aioproducer alone: the same scenario, before and after, in pairs.

    python benchmarks/paired.py OLD_TREE SCENARIO RECORDS PAIRS [CLIENT_ARGS_OF_NEW...]
    # e.g. git worktree add /tmp/old HEAD~1 && (cd /tmp/old && pip install -e . --no-deps)
    #      python benchmarks/paired.py /tmp/old enqueue-gather 500000 4
    # a setting's cost on one tree: OLD_TREE is this tree, the new side gets the arguments
    # (those after a `--`, both sides)
    #      python benchmarks/paired.py . per-record 500000 8 --hooks otel-metrics -- --preload

One broker for every run; each pair runs old and new back to back, alternating which goes
first, so the host's drift touches both alike. Prints, per measure, the median ratio new/old
over the pairs and its range. OLD_TREE is a checkout of aioproducer with its speed-up built;
the new side is this tree. For changes too small to show in run.py's rounds against peers.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioproducer.testing import EmbeddedBroker  # noqa: E402

from run import BROKER_CORE, CLIENT_CORE, PINNED  # noqa: E402


def main() -> None:
    old_tree, scenario, records, pairs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    new_args, both_args = sys.argv[5:], []
    if "--" in new_args:
        at = new_args.index("--")
        new_args, both_args = new_args[:at], new_args[at + 1:]
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with EmbeddedBroker() as broker:
        pin: list[str] = []
        if scenario in PINNED:
            subprocess.run(["taskset", "-a", "-p", "-c", BROKER_CORE, str(broker.pid)],
                           check=True, capture_output=True)
            pin = ["taskset", "-c", CLIENT_CORE]
        for i in range(pairs):
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                topic = f"paired-{scenario}-{i}-{side}"
                broker.create_topic(topic, 6)
                env = dict(os.environ, PYTHONPATH=old_tree if side == "old" else str(ROOT))
                done = subprocess.run(
                    [*pin, sys.executable, str(ROOT / "benchmarks" / "clients.py"), "aioproducer",
                     scenario, "--bootstrap", broker.bootstrap, "--topic", topic,
                     "--records", records, "--uvloop", *both_args, *(new_args if side == "new" else [])],
                    capture_output=True, text=True, env=env, timeout=600, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                latencies = sorted(result.pop("latencies") or [])
                if latencies:
                    result["p50"] = latencies[len(latencies) // 2]
                    result["p99"] = latencies[int(len(latencies) * 0.99)]
                runs[side].append(result)
    for measure in ("seconds", "cpu", "cpu_run", "p50", "p99"):
        if measure in runs["new"][0]:
            ratios = [new[measure] / old[measure] for new, old in zip(runs["new"], runs["old"])]
            print(f"{scenario} {measure}: new/old {statistics.median(ratios):.3f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) over {pairs} pairs")


if __name__ == "__main__":
    main()
