"""Peak resident memory of the GRPO update (and optionally of README's demo), on CPU.

Each case runs in a fresh subprocess, so one case's buffers and compiled programs never count
against another's. A step case builds the tiny policy, a testbed-shaped batch (G=8 groups x
(n=4 + R=4) slots = 64 rows, every row filled to T, `train_bench.synthetic_batch`), compiles one
jitted `hsjax.rl.grpo.train_step` and runs it once; it reports VmHWM (the kernel's peak resident
set) after set-up, after compiling and after the step, and XLA's planned temporaries for the
step (`compiled.memory_analysis()`). The parent polls the child's VmRSS and
kills it above `--limit-gb`, reporting "> limit": a case that would be OOM-killed on a shared
machine is a result too.

    python perf/memory_bench.py                       # T = 512, 1024, 2048, about 5 minutes
    python perf/memory_bench.py --T 2048 --micro-batches 4 --remat
    python perf/memory_bench.py --demo                # + README's demo (slow: 6-15 minutes)
    python perf/memory_bench.py --T 2048 --lora-rank 8  # the update of LoRA adapters (all projections)

Every step case also reports the bytes of the train state it holds (params, or the frozen base and
the adapters; the optimizer state), counted from the arrays' shapes and dtypes.

`--demo` runs `python run.py --config experiments/testbed.py:demo` in a temporary workdir and
samples the resident memory of its whole process tree every 0.2 s (the demo starts voter servers
as child processes); it reports the peak of the tree's sum, the peak of its largest process, the
wall time and the demo line printed last before the peak (which phase holds it).
"""
import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GIB = 1024**3  # every figure is in GiB


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, nargs="*", default=[512, 1024, 2048],
                   help="row lengths (none: no step case)")
    p.add_argument("--groups", type=int, default=8, help="G")
    p.add_argument("--n", type=int, default=4, help="base slots per group")
    p.add_argument("--R", type=int, default=4, help="rescue slots per group (k x m)")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--remat", action="store_true", help="rematerialise each layer")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: train LoRA adapters of this rank on every projection")
    p.add_argument("--limit-gb", type=float, default=16.0, help="kill a case above this RSS (GiB)")
    p.add_argument("--demo", action="store_true", help="also README's demo (slow)")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--repo", default=REPO, help="checkout to measure (default: this one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def vm_kib(pid, key: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/<pid>/status, in KiB (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def child_step(args) -> None:
    """One step case, in this (fresh) process; prints one JSON line."""
    import jax

    sys.path.insert(0, HERE)
    from train_bench import synthetic_batch
    from hsjax.models.model import init_params
    from hsjax.models.presets import get_preset
    from hsjax.rl import grpo
    from hsjax.rl.losses import LossConfig
    from hsjax.rl.optim import make_optimizer

    T = args.T[0]
    hwm = lambda: vm_kib("self", "VmHWM") * 1024 / GIB  # noqa: E731
    cfg = get_preset("tiny", remat=args.remat)
    optimizer = make_optimizer(learning_rate=1e-6, warmup_steps=1, total_steps=1000)
    params = init_params(cfg, jax.random.key(0))
    frozen, materialize = (), None
    if args.lora_rank:
        from hsjax.models import lora
        frozen = (params,)
        materialize = functools.partial(lora.merge, scale=lora.scale_of(16.0, args.lora_rank))
        params = lora.init_adapters(params, args.lora_rank, tuple(lora.INPUT_AXES), jax.random.key(2))
    state = grpo.init_train_state(params, optimizer, jax.random.key(1))
    state_gb = sum(x.nbytes for x in jax.tree.leaves((state, frozen))) / GIB
    batch = jax.device_put(synthetic_batch(args.groups, args.n, args.R, T, cfg.vocab_size))
    step = grpo.jit_train_step(cfg, LossConfig(), optimizer, num_micro_batches=args.micro_batches,
                               materialize=materialize)
    setup_gb = hwm()
    t0 = time.perf_counter()
    compiled = step.lower(state, batch, *frozen).compile()
    compile_s = time.perf_counter() - t0
    compile_gb = hwm()
    # XLA's own plan for the step's temporaries (buffer assignment; independent of the machine's
    # load and of the allocator), beside the measured peak.
    analysis = compiled.memory_analysis()
    temp_gb = analysis.temp_size_in_bytes / GIB if analysis is not None else float("nan")
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch, *frozen)
    jax.block_until_ready((state, metrics))
    step_s = time.perf_counter() - t0
    print(json.dumps(dict(T=T, state_gb=state_gb, setup_gb=setup_gb, compile_gb=compile_gb, peak_gb=hwm(), temp_gb=temp_gb,
                          compile_s=compile_s, step_s=step_s,
                          loss_pg=float(metrics["loss/pg"]))), flush=True)


def watch(cmd, limit_gb, cwd, tree=False):
    """Runs `cmd`, polling RSS; returns (stdout lines with their times, peak info, killed, wall)."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=cwd)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.perf_counter() - t0, line.rstrip("\n")) for line in proc.stdout), daemon=True)
    reader.start()
    peak = dict(sum_gb=0.0, max_proc_gb=0.0, at_s=0.0, at_unix=0.0, last_line="")
    killed = False
    while proc.poll() is None:
        pids = [proc.pid] + (descendants(proc.pid) if tree else [])
        rss = [vm_kib(p, "VmRSS") * 1024 / GIB for p in pids]
        if sum(rss) > peak["sum_gb"]:
            peak.update(sum_gb=sum(rss), at_s=time.perf_counter() - t0, at_unix=time.time(),
                        last_line=lines[-1][1] if lines else "")
        peak["max_proc_gb"] = max([peak["max_proc_gb"], *rss])
        if sum(rss) > limit_gb:
            proc.kill()
            killed = True
        time.sleep(0.2)
    reader.join()
    return lines, peak, killed, time.perf_counter() - t0


def descendants(pid) -> list:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children = {}
    pairs = [tuple(map(int, line.split())) for line in out.strip().splitlines()]
    for p, pp in pairs:
        children.setdefault(pp, []).append(p)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def run_step(args, T):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--T", str(T),
           "--groups", str(args.groups), "--n", str(args.n), "--R", str(args.R),
           "--micro-batches", str(args.micro_batches), "--lora-rank", str(args.lora_rank)] + (
               ["--remat"] if args.remat else [])
    lines, peak, killed, wall = watch(cmd, args.limit_gb, args.repo)
    if killed:
        return dict(T=T, killed=True, peak_gb=peak["sum_gb"], wall_s=wall)
    for _, line in lines:
        if line.startswith("{"):
            return dict(json.loads(line), killed=False, wall_s=wall)
    # Failed without our limit: XLA's own out-of-memory error is a result too (its last line).
    return dict(T=T, killed=True, error=lines[-1][1] if lines else "no output", wall_s=wall)


def run_demo(args):
    workdir = tempfile.mkdtemp(prefix="memory_bench_demo_")
    cmd = [sys.executable, "run.py", "--config", "experiments/testbed.py:demo", "--workdir", workdir]
    lines, peak, killed, wall = watch(cmd, args.limit_gb, args.repo, tree=True)
    return dict(peak, killed=killed, wall_s=wall, workdir=workdir,
                tail=[line for _, line in lines[-12:]])


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child_step(args)
    command = " ".join(["python", "perf/memory_bench.py"] + (sys.argv[1:] if argv is None else argv))
    B = args.groups * (args.n + args.R)
    print(f"memory_bench: tiny policy, {B} rows, {args.micro_batches} micro-batches, "
          f"remat {args.remat}, LoRA rank {args.lora_rank or 'off'}, kill above {args.limit_gb} GiB", flush=True)
    results = {"command": command, "steps": [], "demo": None}
    for T in args.T:
        r = run_step(args, T)
        results["steps"].append(r)
        print(f"  T={T}: {r}", flush=True)
    if args.demo:
        results["demo"] = run_demo(args)
    print(f"\nPeak resident memory (VmHWM) of one jitted GRPO update, tiny policy, "
          f"G={args.groups} x (n={args.n} + R={args.R}) = {B} rows, "
          f"{args.micro_batches} micro-batches, remat {args.remat}, LoRA rank {args.lora_rank or 'off'}")
    print("|    T | train state | after set-up | after compile | peak (steps) | XLA temp | compile s | step s |")
    print("|------|-------------|--------------|---------------|--------------|----------|-----------|--------|")
    for r in results["steps"]:
        if r["killed"]:
            what = r.get("error") or f"> {args.limit_gb:.1f} GiB (killed)"
            print(f"| {r['T']:>4} |             |              |               | {what} |  |  |  |")
        else:
            print(f"| {r['T']:>4} | {1024 * r['state_gb']:>7.1f} MiB | {r['setup_gb']:>9.2f} GiB | {r['compile_gb']:>10.2f} GiB | "
                  f"{r['peak_gb']:>9.2f} GiB | {r['temp_gb']:>4.2f} GiB | {r['compile_s']:>9.1f} | "
                  f"{r['step_s']:>6.1f} |")
    d = results["demo"]
    if d:
        print(f"\nREADME's demo: peak {d['sum_gb']:.2f} GiB (process tree), largest process "
              f"{d['max_proc_gb']:.2f} GiB, wall {d['wall_s']:.0f} s{' (KILLED)' if d['killed'] else ''}; "
              f"peak at {d['at_s']:.0f} s, after the line: {d['last_line']!r}")
    print(f"command: {command}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
