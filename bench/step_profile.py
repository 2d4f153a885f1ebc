"""Where a training step's time goes, by kind of work, from the trace mltrain writes for
train.profile_steps (RUN_DIR/profile/steps_FIRST-LAST.json, torch's Chrome trace).

usage: step_profile.py TRACE [--markdown]

On a GPU it sums the device's kernels and copies by class: matrix products, attention,
elementwise work, reductions, copies and dtype casts, the optimizer, communication, mltrain's own
kernels (the fused CUDA kernels of issue 25, once they exist), other; and the idle time, when the
device ran nothing between the traced steps' first kernel and their last (the gap between the two
steps included). The profiler slows the host while it records, so the idle time is an upper bound.
Kernels that overlap (communication beside computation) each count whole, so the sum can exceed
the wall time. The GEMM time inside the running step settles how fast the products run there,
against bench/matmul_rate.py's products alone.

On the CPU, where the trace holds operators rather than kernels, it sums each operator's own time
(its duration less that of the operators it called) by the same classes; the time of mltrain's
phases outside any operator is mltrain's fused CPU kernels (their forward passes record no
operator) and the host's own work.

Prints one line per class (class, milliseconds, share), or with --markdown a table.
"""
import argparse
import json
import sys
from collections import defaultdict

# Classes in the order they are tested: the first that matches a name wins. A copy kernel's name
# holds "elementwise_kernel" too, so copies come first.
CLASSES = [
    ("communication", ("nccl", "c10d::", "allreduce", "all_reduce")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matrix products", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm",
                         "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")),
    # A dtype cast is a copy kernel on the GPU (aten::to on the CPU); "cast" alone would also take
    # the elementwise kernels named gpu_kernel_impl_nocast or LoadWithCast.
    ("copies and casts", ("copy", "memcpy", "memset", "aten::to")),
    ("reductions", ("reduce_kernel", "aten::sum", "aten::mean", "aten::amax", "aten::logsumexp",
                    "aten::linalg_vector_norm", "norm_kernel")),
    ("mltrain's kernels", ("mltrain",)),
    ("elementwise", ("elementwise", "aten::")),
]


def classify(name):
    lowered = name.lower()
    for label, keys in CLASSES:
        if any(key.lower() in lowered for key in keys):
            return label
    return "other"


def union_length(intervals):
    """The length of the union of [start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def gpu_classes(kernels):
    """Milliseconds by class of the device's kernels, and the idle time between them."""
    by_class = defaultdict(float)
    for event in kernels:
        by_class[classify(event["name"])] += event["dur"] / 1e3
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    by_class["idle (no kernel running)"] = (span - union_length(intervals)) / 1e3
    return by_class


def own_times(events):
    """Each event's duration less that of the events nested in it on its thread."""
    by_thread = defaultdict(list)
    for event in events:
        by_thread[event.get("tid")].append(event)
    own = []
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, own time]
        for event in thread_events:
            while stack and event["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                own.append(tuple(stack.pop()))
            if stack:
                stack[-1][1] -= event["dur"]
            stack.append([event, event["dur"]])
        own.extend(tuple(entry) for entry in stack)
    return own


OUTSIDE_OPERATORS = "outside operators (mltrain's fused CPU kernels, host work)"


def cpu_classes(operators):
    """Milliseconds by class of the operators' own times, on the CPU."""
    by_class = defaultdict(float)
    for event, own in own_times(operators):
        name = event["name"]
        if name.startswith("mltrain::") or "CppNode<mltrain" in name:
            label = OUTSIDE_OPERATORS
        elif name.startswith("autograd::") or "Backward" in name or "AccumulateGrad" in name:
            label = "autograd bookkeeping"
        else:
            label = classify(name)
        by_class[label] += max(own, 0.0) / 1e3
    return by_class


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if kernels:
        where, by_class = "the GPU's kernels", gpu_classes(kernels)
    else:
        operators = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
        if not operators:
            sys.exit(f"{args.trace}: no kernels and no operators in the trace")
        where, by_class = "the CPU's operators (own time)", cpu_classes(operators)
    total = sum(by_class.values())
    if total <= 0:
        sys.exit(f"{args.trace}: the traced steps took no time")
    rows = sorted(by_class.items(), key=lambda item: -item[1])
    if args.markdown:
        print(f"Time of the traced steps by kind of work, from {where}; {total:,.1f} ms in all.\n")
        print("| work | ms | share |")
        print("| --- | ---: | ---: |")
        for label, ms in rows:
            print(f"| {label} | {ms:,.1f} | {ms / total:.1%} |")
    else:
        for label, ms in rows:
            print(f"{label}\t{ms:.3f}\t{ms / total:.4f}")


if __name__ == "__main__":
    main()
