"""What the recipe's ``verl.plugins`` entry point costs every process: ``import verl`` with and without it.

verl imports the plugin inside ``import verl`` in the driver and in every Ray worker. Each repetition starts a
fresh interpreter that runs ``import verl`` and reports its own wall time; the arms alternate (plugin on, plugin
off with ``VERL_USE_EXTERNAL_PLUGINS=none``) so that machine noise hits both alike. Three process kinds:

- here:        a process on this machine as launched from a shell (no accelerator here: the CPU platform loads)
- gpu machine: ``VERL_PLATFORM=cuda``, what a GPU node's processes decide (the CPU platform is never imported)
- ray worker:  ``RAY_RAYLET_PID`` set, as in every Ray worker without the ``platform=cpu`` pin

The headline overhead is the largest of the three medians of paired differences.

Run: python bench/plugin_import_cost.py [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

TIMED_IMPORT = "import time; t = time.perf_counter(); import verl; print(time.perf_counter() - t)"
KINDS = {
    "here": {},
    "gpu machine": {"VERL_PLATFORM": "cuda"},
    "ray worker": {"RAY_RAYLET_PID": "1"},
}


def import_seconds(extra_env: dict, plugin: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_RAYLET_PID", "VERL_USE_EXTERNAL_PLUGINS")}
    env.update(extra_env)
    if not plugin:
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    out = subprocess.run([sys.executable, "-c", TIMED_IMPORT], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions per arm and process kind")
    args = parser.parse_args()

    import_seconds({}, plugin=True)  # warm the file cache once
    rows = {}
    for kind, env in KINDS.items():
        with_plugin, without, diffs = [], [], []
        for rep in range(args.reps):
            order = (True, False) if rep % 2 == 0 else (False, True)
            times = {plugin: import_seconds(env, plugin) for plugin in order}
            with_plugin.append(times[True])
            without.append(times[False])
            diffs.append(times[True] - times[False])
        rows[kind] = (statistics.median(without), statistics.median(with_plugin), statistics.median(diffs))

    print(f"import verl, {args.reps} interleaved repetitions per arm (median seconds)")
    print(f"{'process':<12} {'bare':>7} {'plugin':>7} {'overhead':>9}")
    for kind, (bare, plugin, diff) in rows.items():
        print(f"{kind:<12} {bare:7.2f} {plugin:7.2f} {diff:9.3f}")
    worst = max(diff for _, _, diff in rows.values())
    print(f"RESULT plugin_import_overhead_s={worst:.3f} bare_import_s={rows['here'][0]:.2f}")


if __name__ == "__main__":
    main()
