"""The GPU engine: ragged-batch models, attention backends, CUDA graphs and lazy results.

    engine = load_engine(model_dir, device="cuda")
    lazy = engine.step(batch)      # returns at once on a GPU
    rows = lazy.wait()             # float32 [batch.num_seqs, engine.info.output_dim]
    lazy.release()
"""

from quiver.worker.engine.batch import Batch
from quiver.worker.engine.engine import Engine, EngineInfo
from quiver.worker.engine.lazy import LazyTensor, SlotsBusyError
from quiver.worker.engine.startup import load_engine

__all__ = ["Batch", "Engine", "EngineInfo", "LazyTensor", "SlotsBusyError", "load_engine"]
