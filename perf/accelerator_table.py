"""The table of `perf/accelerator_check.sh`: its steps' JSON files, one row each.

    python perf/accelerator_table.py accelerator_check/

Update rows (train_bench.py) and the peer (torch_peer_update.py) give step time, tokens/s and MFU;
each update row's last column is its tokens/s over the peer's. The sampler row gives end-to-end
tokens/s, the decode step and its fraction of the bandwidth measured in the same script. A step
that failed or timed out (a `.failed` file beside its log) is a row saying so.
"""
import json
import os
import sys

UPDATES = [(f"update_{attn}_{micro}", f"hsjax update, {attn} attention, {micro} micro-batch"
            + ("es" if micro > 1 else "")) for attn in ("cudnn", "xla") for micro in (4, 1)]


def load(folder: str, name: str):
    path = os.path.join(folder, name + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def failure(folder: str, name: str) -> str:
    path = os.path.join(folder, name + ".failed")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    return "not run"


def mfu(r) -> str:
    return "–" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"


def rows(folder: str) -> list:
    peer = load(folder, "peer")
    out = []
    for name, label in UPDATES:
        r = load(folder, name)
        if r is None:
            if not os.path.exists(os.path.join(folder, name + ".log")):
                continue  # not part of this run (the dry run has no cuDNN)
            out.append((label, failure(folder, name), "", "", ""))
            continue
        ratio = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer else "–"
        out.append((label, f"{r['step_s_median'] * 1e3:,.0f} ms", f"{r['tokens_per_s']:,.0f}",
                    mfu(r), ratio))
    if peer:
        out.append((f"PyTorch peer (torch {peer['torch']}, transformers {peer['transformers']}, "
                    f"SDPA, checkpointing, bf16 autocast, AdamW)", f"{peer['step_s_median'] * 1e3:,.0f} ms",
                    f"{peer['tokens_per_s']:,.0f}", mfu(peer), "1.00x"))
    else:
        out.append(("PyTorch peer", failure(folder, "peer"), "", "", ""))
    return out


def sampler_line(folder: str) -> str:
    s = load(folder, "sampler")
    if s is None:
        return f"sampler: {failure(folder, 'sampler')}"
    return (f"sampler ({s['model']}, batch {s['batch']}, prompt {s['prompt']}, {s['new_tokens']} new): "
            f"{s['jax_tokens_per_s']:,.0f} tok/s end to end, decode step {s['decode_step_s'] * 1e3:.2f} ms, "
            f"{s['roofline_fraction']:.3f} of the {s['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
            "measured by the same script")


def main(argv=None):
    folder = (argv or sys.argv[1:] or ["accelerator_check"])[0]
    first = next((load(folder, n) for n, _ in UPDATES if load(folder, n)), None)
    where = f"{first['device']} ({first['backend']}), jax {first['jax']}" if first else "unknown device"
    print(f"\naccelerator check: {where}; shapes of train_bench.py "
          f"({first['preset']}, {first['rows']} rows x T={first['T']})" if first else "")
    print("\n| run | step | tokens/s | MFU | hsjax / peer |\n| --- | --- | --- | --- | --- |")
    for row in rows(folder):
        print("| " + " | ".join(row) + " |")
    print("\n" + sampler_line(folder))
    print("command: bash perf/accelerator_check.sh")


if __name__ == "__main__":
    main()
