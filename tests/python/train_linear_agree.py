#!/usr/bin/env python3
"""The Python example trainer prints the same loss curve on every strategy (within float rounding),
multi-worker under the launcher included, and learns y = 2x + 1:

    train_linear_agree.py TRAIN_LINEAR_PY TRIBUTARY_RUN
"""
import re
import subprocess
import sys

CURVE = re.compile(r"epoch (\d+): loss ([-0-9.]+) w ([-0-9.]+) b ([-0-9.]+)")
ARGS = ["--epochs", "6", "--global-batch", "8", "--examples", "60", "--seed", "7"]


def curve(name, cmd):
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if run.returncode != 0:
        # What the run said, so that a failure here can be told from a wrong curve.
        print(f"{name}: exited with {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}",
              flush=True)
        raise SystemExit(1)
    out = run.stdout
    points = [tuple(float(v) for v in m.groups()) for m in CURVE.finditer(out)]
    print(f"{name}:\n" + "\n".join(f"  epoch {p[0]:.0f}: loss {p[1]} w {p[2]} b {p[3]}" for p in points),
          flush=True)
    return points


def main(script, launcher):
    py = [sys.executable, script]
    reference = curve("default", py + ["--strategy", "default"] + ARGS)
    assert len(reference) == 6, "the default strategy printed no curve"
    last = reference[-1]
    assert abs(last[2] - 2) < 0.3 and abs(last[3] - 1) < 0.2, f"did not learn y = 2x + 1: {last}"
    runs = {
        "mirrored x3": py + ["--strategy", "mirrored", "--replicas", "3"] + ARGS,
        "mirrored x2 hierarchical_copy":
            py + ["--strategy", "mirrored", "--replicas", "2", "--backend", "hierarchical_copy"] + ARGS,
        "central_storage x2": py + ["--strategy", "central_storage", "--replicas", "2"] + ARGS,
        "multi_worker_mirrored 2 workers x 2 (ring)":
            [launcher, "-n", "2", "--timeout", "200s", "--"] + py
            + ["--strategy", "multi_worker_mirrored", "--replicas", "2"] + ARGS,
    }
    bad = False
    for name, cmd in runs.items():
        got = curve(name, cmd)
        if len(got) != len(reference):
            print(f"{name}: expected {len(reference)} epochs, got {len(got)}")
            bad = True
            continue
        for a, b in zip(reference, got):
            if any(abs(x - y) > 2e-5 for x, y in zip(a[1:], b[1:])):
                print(f"{name} differs from default: {a} vs {b}")
                bad = True
    if bad:
        return 1
    print("every strategy agrees")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
