"""Ferry's offload engine: pure PyTorch, never imports ComfyUI or Gradio.

    from offload_core import apply_offload, OffloadPolicy, BlockLevel, DiskTier

    handle = apply_offload(model, OffloadPolicy(level=BlockLevel(2), tier=DiskTier("/nvme/ferry")),
                           onload_device="cuda")
    y = model(x)              # groups stream in on a side stream while earlier ones compute
    print(handle.stats())     # bytes moved per tier, GB/s, stall time, overlap, peak memory
    handle.remove()           # every parameter back where and as it was; Ferry's files deleted

Importing this package starts no thread, opens no file and does not initialise CUDA.
"""

from .api import OffloadHandle, apply_offload, find_offload
from .ending import Ending
from .errors import (
    AlreadyOffloadedError,
    ApiUseError,
    ConfigError,
    CorruptGroupFileError,
    DiskPathError,
    FerryError,
    GroupingError,
    InferenceOnlyError,
    RestoreIncompleteError,
    UnsupportedTensorError,
    WeightsLostError,
)
from .loader import load_offloaded
from .model.plan import OffloadPlan, plan_offload
from .model.regional_compile import CompiledBlocks, CompileSettings
from .offload_kind import OffloadKind
from .policy import (
    BlockLevel,
    DiskTier,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    SharedRamTier,
)
from .registry import live_offloads
from .runtime.memory import (
    DeviceMemory,
    PeakRssSampler,
    ProcessMemory,
    device_memory,
    process_memory,
    system_available_ram,
)
from .runtime.stats import OffloadStats
from .sources.checkpoint_stream import CheckpointWeights

__all__ = [
    "AlreadyOffloadedError",
    "ApiUseError",
    "BlockLevel",
    "CheckpointWeights",
    "CompileSettings",
    "CompiledBlocks",
    "ConfigError",
    "CorruptGroupFileError",
    "DeviceMemory",
    "DiskPathError",
    "DiskTier",
    "Ending",
    "FerryError",
    "GroupingError",
    "InferenceOnlyError",
    "LeafLevel",
    "OffloadHandle",
    "OffloadKind",
    "OffloadPlan",
    "OffloadPolicy",
    "OffloadStats",
    "PeakRssSampler",
    "PinnedRamTier",
    "ProcessMemory",
    "RamTier",
    "RestoreIncompleteError",
    "SharedRamTier",
    "UnsupportedTensorError",
    "WeightsLostError",
    "apply_offload",
    "device_memory",
    "find_offload",
    "live_offloads",
    "load_offloaded",
    "plan_offload",
    "process_memory",
    "system_available_ram",
]
