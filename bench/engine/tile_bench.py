"""The row kernels' launch tiles (rows and warps per program) against the bytes they must move.

    python -m quiver.bench.engine.tile_bench [--tokens 4096,16384] [--out FILE]

For q/k RMSNorm + rotary and residual add + RMSNorm (pplx-embed-0.6B shape) and residual add + LayerNorm
(BGE-M3 shape), every candidate launch (a norm's `triton_ops.Tile`; q/k's heads and warps per program, a
token each) is first checked
against the plain PyTorch unit, then timed as kernel_bench times a unit (inside a CUDA graph, over input
sets that outgrow L2). Each table row gives the default tile, the fastest tile, the tile of one row per
program (these kernels' first launch: a program per token, all of its heads), and the bound: the fewest
bytes the unit must move over the device-to-device copy bandwidth measured in the same run. Needs a CUDA
device.
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any, Callable

import torch
import triton

from quiver.bench.engine.kernel_bench import BGE_M3, L2_FLUSH_BYTES, PPLX, copy_bandwidth_gbs, graph_time_us, unit_cases
from quiver.worker.engine.layers import fused, triton_ops
from quiver.worker.engine.layers.triton_ops import Tile

UNITS = (("q/k RMSNorm + rotary", PPLX), ("residual add + RMSNorm", PPLX), ("residual add + LayerNorm", BGE_M3))
WARPS = (1, 2, 4, 8, 16)


def candidates(unit: str, shape: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, keyword arguments) of every launch worth timing: 2 to 64 elements a thread."""
    out: list[tuple[str, dict[str, Any]]] = []
    if unit == "qk_norm_rope":
        heads = shape.heads + shape.kv_heads
        for group in (2, 4, 8, 16, triton.next_power_of_2(heads)):
            for warps in WARPS:
                if 2 <= group * shape.head_dim // (32 * warps) <= 64:
                    out.append((f"{group} heads, {warps} warps", {"heads_per_program": group, "warps": warps}))
        return out
    for rows in (1, 2, 4, 8, 16):
        for warps in WARPS:
            if 2 <= rows * shape.hidden // (32 * warps) <= 64:
                out.append((f"{rows} rows, {warps} warps", {"tile": Tile(rows, warps)}))
    return out


def first_launch(unit: str, shape: Any) -> dict[str, Any]:
    """The launch these kernels had before tiles: one program per token (all of its heads, for q/k)."""
    if unit == "qk_norm_rope":
        group = triton.next_power_of_2(shape.heads + shape.kv_heads)
        return {"heads_per_program": group, "warps": triton_ops.row_warps(group * shape.head_dim)}
    return {"tile": Tile(1, triton_ops.row_warps(triton.next_power_of_2(shape.hidden)))}


def _agrees(fn: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    actual, expected = fn(*args), reference(*args)
    pairs = zip(actual, expected) if isinstance(expected, tuple) else [(actual, expected)]
    for a, e in pairs:
        scale = e.float().abs().max().item()
        if not torch.allclose(a.float(), e.float(), rtol=2**-7, atol=2**-7 * scale):
            return False
    return True


def _case(shape: Any, tokens: int, label: str) -> tuple[str, str, tuple[Any, ...], int]:
    """kernel_bench's case for one unit, fresh random inputs."""
    return next(case for case in unit_cases(shape, tokens) if case[0] == label)


def bench_tiles(tokens_list: list[int], bandwidth: float) -> list[dict[str, Any]]:
    plain = fused.plain_ops()
    rows = []
    for label, shape in UNITS:
        for tokens in tokens_list:
            _, unit, first_args, moved = _case(shape, tokens, label)
            copies = max(2, -(-L2_FLUSH_BYTES // moved))
            arg_sets = [first_args] + [_case(shape, tokens, label)[2] for _ in range(copies - 1)]
            kernel = getattr(triton_ops, unit)
            timed: dict[str, float] = {}
            left_out = []
            launches = [("default", {}), ("one row a program", first_launch(unit, shape))]
            for name, kwargs in launches + candidates(unit, shape):
                fn = functools.partial(kernel, **kwargs)
                if not _agrees(fn, getattr(plain, unit), arg_sets[0]):
                    print(f"  {label} {tokens}: {name} disagrees with the plain unit; left out", flush=True)
                    left_out.append(name)
                    continue
                timed[name] = graph_time_us(fn, arg_sets)
            best = min((name for name in timed if name not in ("default", "one row a program")), key=timed.get)
            row = {"shape": shape.name, "unit": label, "tokens": tokens, "bound_us": moved / bandwidth / 1e3,
                   "default_us": timed["default"], "one_row_us": timed["one row a program"],
                   "best": best, "best_us": timed[best], "all_us": timed, "left_out": left_out}
            rows.append(row)
            print(f"| {shape.name} | {label} | {tokens} | {row['bound_us']:.1f} | {row['one_row_us']:.1f} | "
                  f"{row['default_us']:.1f} ({row['default_us'] / row['bound_us']:.2f}) | {best}: "
                  f"{row['best_us']:.1f} ({row['best_us'] / row['bound_us']:.2f}) |", flush=True)
            del arg_sets, first_args
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--out", default=None, help="write every tile's time as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {bandwidth:.0f} GB/s (read + write)")
    print("| shape | unit | tokens | bound µs | one row a program µs | default µs (× bound) | fastest tile: µs (× bound) |")
    rows = bench_tiles([int(t) for t in args.tokens.split(",")], bandwidth)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbs": bandwidth, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
