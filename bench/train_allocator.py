"""`bamctl train --cpu-allocator keep` against `system` (glibc's defaults), side by side.

Each run is `bamctl train --recipe RECIPE --steps N` in a process of its own, the two allocators
alternating, `--repeats` times each; a run's seconds per step is its checkpoint's recorded
training wall time over N (start-up and model building left out). The weights of every run are
hashed: both ways must give the same bytes.

    python bench/train_allocator.py --recipe lm-bam --steps 20 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ALLOCATORS = ("system", "keep")


def one_run(recipe: str, steps: int, allocator: str, out: Path) -> tuple[float, str, float]:
    """(seconds per step, weights digest, system CPU seconds of the child)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    subprocess.run([sys.executable, "-m", "bamctl", "train", "--recipe", recipe, "--steps", str(steps), "--device", "cpu",
                    "--out", str(out), "--restart", "--cpu-allocator", allocator], check=True, capture_output=True)
    system = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before
    provenance = json.loads((out / "config.json").read_text())["provenance"]
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    return provenance["wall_time_s"] / steps, digest, system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="lm-bam")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {name: [] for name in ALLOCATORS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for name in ALLOCATORS:
                runs[name].append(one_run(args.recipe, args.steps, name, Path(folder) / name))
    print(f"bamctl train --recipe {args.recipe} --steps {args.steps}, one thread (the recipe's), {args.repeats} runs each, alternated\n")
    print("| --cpu-allocator | s/step, each run | median s/step | system CPU s per run | weights |")
    print("|---|---|---|---|---|")
    medians = {}
    for name in ALLOCATORS:
        seconds = [r[0] for r in runs[name]]
        medians[name] = statistics.median(seconds)
        print(f"| {name} | {', '.join(f'{s:.3f}' for s in seconds)} | {medians[name]:.3f} | "
              f"{statistics.median(r[2] for r in runs[name]):.1f} | {', '.join(sorted({r[1] for r in runs[name]}))} |")
    same = len({r[1] for name in ALLOCATORS for r in runs[name]}) == 1
    print(f"\nkeep / system: {medians['keep'] / medians['system']:.2f}x the time per step; weights {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
