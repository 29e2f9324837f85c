"""A capture that fails after an RNG draw: does the process stay able to draw and capture, and which
repair restores it? One mode per process (argv[1]): none, fresh, clone."""
import sys
import torch

mode = sys.argv[1]
x = torch.randn(1 << 16, device="cuda")
graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = torch.nn.functional.dropout(x, 0.1)
        float(y.sum())
    print("capture unexpectedly succeeded")
except Exception as exc:  # noqa: BLE001
    print("failed capture:", type(exc).__name__, str(exc).splitlines()[0][:120])
del graph
gen = torch.cuda.default_generators[0]
try:
    if mode == "fresh":
        fresh = torch.Generator(device="cuda")
        fresh.set_state(gen.get_state())
        gen.graphsafe_set_state(fresh)
    elif mode == "clone":
        gen.graphsafe_set_state(gen.clone_state())
    elif mode == "seed":
        gen.manual_seed(gen.initial_seed())
except Exception as exc:  # noqa: BLE001
    print("repair raised:", type(exc).__name__, str(exc).splitlines()[0][:120])
for what in ("randn", "capture", "capture+rng", "randn"):
    try:
        if what == "randn":
            torch.randn(4, device="cuda").sum().item()
        else:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                z = x * 2 if what == "capture" else torch.nn.functional.dropout(x, 0.1)
            g.replay()
            torch.cuda.synchronize()
            if what == "capture":
                assert torch.equal(z, x * 2)
        print(f"{mode}: {what} ok")
    except Exception as exc:  # noqa: BLE001
        print(f"{mode}: {what} FAILS:", type(exc).__name__, str(exc).splitlines()[0][:120])
