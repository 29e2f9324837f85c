"""Host time of one F.linear (with bias) call on the GPU: a new M each call against a repeated M, by BLAS library."""
import statistics, time
import torch
import torch.nn.functional as F

w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
xs = {m: torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16) for m in range(8000, 8000 + 64 * 40, 64)}
for lib in ("cublaslt", "cublas"):
    torch.backends.cuda.preferred_blas_library(lib)
    for label, ms in (("repeated M", [8000] * 40), ("new M each call", list(xs))):
        for m in ms[:5]:
            F.linear(xs[m], w, b)
        torch.cuda.synchronize()
        host = []
        for m in ms:
            start = time.perf_counter(); F.linear(xs[m], w, b); host.append((time.perf_counter() - start) * 1e6)
            torch.cuda.synchronize()
        nob = []
        for m in ms:
            start = time.perf_counter(); F.linear(xs[m], w); nob.append((time.perf_counter() - start) * 1e6)
            torch.cuda.synchronize()
        print(f"{lib:9s} {label:16s}: with bias {statistics.median(host):6.1f} us, without {statistics.median(nob):6.1f} us", flush=True)
