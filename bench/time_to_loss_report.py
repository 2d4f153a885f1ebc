"""The report of bench/time_to_loss.sh: reads OUT/{adamw,muon,reference}_SEED/metrics.jsonl, prints a
markdown table of each optimizer's final validation loss, and the steps and wall time it takes to reach
the final validation loss of the AdamW run of the same seed (the first validation at or below it; the
wall time is the training's own clock at that step, validations before it included), and draws every
validation curve into OUT/time_to_loss.png with gnuplot, where the machine has it.

usage: time_to_loss_report.py OUT "SEED SEED ..." [WHAT]
WHAT names the recipe and the device in the picture's title.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

RUNS = [("adamw", "mltrain, AdamW"), ("muon", "mltrain, Muon"), ("reference", "PyTorch eager, AdamW")]
COLOURS = {"adamw": "#1f77b4", "muon": "#d62728", "reference": "#2ca02c"}


def read_run(directory):
    """(validation losses by step, elapsed seconds by step) of a run's metrics.jsonl."""
    val, elapsed = {}, {}
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "val_loss" in record:
                val[record["step"]] = record["val_loss"]
            elif "elapsed_s" in record and "loss" in record:
                elapsed[record["step"]] = record["elapsed_s"]
    return val, elapsed


def reach(val, elapsed, target):
    """The first validated step at or below `target`, and the wall time to it; None where never."""
    for step in sorted(val):
        if val[step] <= target + 1e-12:
            return step, elapsed.get(step)
    return None, None


def spread(values):
    return f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(out, seeds, what="smoke.yaml on cpu, fp32"):
    seeds = seeds.split()
    runs = {(name, seed): read_run(os.path.join(out, f"{name}_{seed}")) for name, _ in RUNS for seed in seeds}
    targets = {seed: runs[("adamw", seed)][0][max(runs[("adamw", seed)][0])] for seed in seeds}
    print("| run | final val loss, mean (range) over seeds | steps to AdamW's final val loss | "
          "wall time to it | steps, of AdamW's | wall time, of AdamW's | ms per step, validations included |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    adamw_reach = {seed: reach(*runs[("adamw", seed)], targets[seed]) for seed in seeds}
    for name, label in RUNS:
        finals, steps, seconds, step_ratios, time_ratios, per_step = [], [], [], [], [], []
        for seed in seeds:
            val, elapsed = runs[(name, seed)]
            finals.append(val[max(val)])
            per_step.append(1e3 * elapsed[max(elapsed)] / max(elapsed))
            step, wall = reach(val, elapsed, targets[seed])
            if step is None:
                continue
            steps.append(step)
            seconds.append(wall)
            step_ratios.append(step / adamw_reach[seed][0])
            time_ratios.append(wall / adamw_reach[seed][1])
        reached = f"{len(steps)} of {len(seeds)} seeds" if len(steps) < len(seeds) else ""
        if steps:
            print(f"| {label} | {spread(finals)} | {statistics.mean(steps):.0f} {reached} | "
                  f"{statistics.mean(seconds):.1f} s | {statistics.mean(step_ratios):.2f}x | "
                  f"{statistics.mean(time_ratios):.2f}x | {statistics.mean(per_step):.0f} |")
        else:
            print(f"| {label} | {spread(finals)} | not reached | | | | {statistics.mean(per_step):.0f} |")
    print()
    print("Per seed, the final validation loss (AdamW's is the target):")
    print()
    print("| seed | " + " | ".join(label for _, label in RUNS) + " |")
    print("| --- |" + " --- |" * len(RUNS))
    for seed in seeds:
        print(f"| {seed} | " + " | ".join(f"{runs[(name, seed)][0][max(runs[(name, seed)][0])]:.4f}"
                                          for name, _ in RUNS) + " |")
    draw(out, seeds, runs, what)


def draw(out, seeds, runs, what):
    plots = []
    for name, label in RUNS:
        for i, seed in enumerate(seeds):
            path = os.path.join(out, f"{name}_{seed}.val.dat")
            val = runs[(name, seed)][0]
            with open(path, "w") as f:
                f.writelines(f"{step} {val[step]}\n" for step in sorted(val))
            title = f"title '{label}'" if i == 0 else "notitle"
            plots.append(f"'{path}' using 1:2 with lines lw 2 lc rgb '{COLOURS[name]}' {title}")
    script = (f"set terminal pngcairo size 900,560\nset output '{os.path.join(out, 'time_to_loss.png')}'\n"
              f"set title 'validation loss, {what}, one line per seed'\n"
              "set xlabel 'step'\nset ylabel 'validation loss (nats per token)'\nset grid\n"
              "set key top right\nplot " + ", ".join(plots) + "\n")
    # The table is the result; the picture is a view of it, and a machine without gnuplot (the GPU
    # machines have none) still gets the table.
    if shutil.which("gnuplot") is None:
        print("\nno gnuplot on this machine: no time_to_loss.png", file=sys.stderr)
        return
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"\ncurves: {os.path.join(out, 'time_to_loss.png')}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
