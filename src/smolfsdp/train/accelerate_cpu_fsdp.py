"""Let accelerate apply FSDP on CPU processes (gloo), so the TRL engine shards in the smoke profile.

Why this module exists: accelerate 1.15 applies an FSDP plugin only on accelerators.
``AcceleratorState.__init__`` (accelerate/state.py) keeps the plugin, sets
``DistributedType.FSDP`` and the plugin's mixed-precision policy only inside its branch for
``MULTI_GPU``/``MULTI_XPU``/... distributed types; a CPU run is ``MULTI_CPU``, the plugin is
dropped, and ``Accelerator.prepare_model`` wraps the model in ``DistributedDataParallel``. The
Trainer then trains DDP while its ``fsdp_config`` says FSDP. PyTorch itself has no such limit:
``FullyShardedDataParallel`` shards on gloo (the native engine does it), so the gate is accelerate's
choice, not a constraint of FSDP.

What :func:`lift_cpu_fsdp_gate` changes, and nothing else:

1. After ``AcceleratorState.__init__`` has run for a ``MULTI_CPU`` process group with an FSDP
   plugin, it does what that method does for accelerators: sets ``distributed_type = FSDP``, keeps
   the plugin and applies the mixed-precision setting to it (``fsdp_plugin.set_mixed_precision``).
2. It sets the state's device to a plain ``cpu``: accelerate's ``MULTI_CPU`` device is ``cpu:0``, and
   FSDP1 refuses ``device_id=cpu:0`` for modules whose parameters are on ``cpu`` ("Inconsistent
   compute device and `device_id`").

The third obstacle is not patched but avoided: accelerate's full-state-dict gather
(``Accelerator.get_state_dict``, used by ``Trainer.save_model`` under FSDP) asks FSDP1 for
``offload_to_cpu=True``, which crashes rank 0 on a CPU-only gloo run (torch 2.13: SIGSEGV); the TRL
engine exports its final model through ``smolfsdp.train.export.save_final_model`` instead, which offloads
only on CUDA (one export path for both engines).

Things that still cannot run on CPU and are refused before launch elsewhere: FSDP1
``sync_module_states`` and ``cpu_offload`` (torch needs an accelerator for both).

The patch is installed by the TRL engine on CPU runs when ``TrainConfig.accelerate_fsdp_on_cpu``
is true (the default; ``--accelerate_fsdp_on_cpu false`` shows what accelerate does as shipped:
DDP, reported as such). It does nothing on GPU runs, where accelerate already applies FSDP.

    smolfsdp train --config configs/runs/smoke_trl.yaml                                # FSDP1 on 2 CPU ranks
    smolfsdp train --config configs/runs/smoke_trl.yaml --accelerate_fsdp_on_cpu false  # DDP, as shipped
"""

from __future__ import annotations

import functools
import inspect

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

#: What the summary says when the gate was lifted (``smolfsdp.train.trl_engine.detect_effective``).
REASON = (
    "accelerate applies FSDP only on accelerators; smolfsdp.train.accelerate_cpu_fsdp lifted that gate for "
    "this CPU (gloo) run, so accelerate wrapped the model in FullyShardedDataParallel"
)

_ORIGINAL_INIT = AcceleratorState.__init__
_SIGNATURE = inspect.signature(_ORIGINAL_INIT)


@functools.wraps(_ORIGINAL_INIT)
def _init_keeping_fsdp_on_cpu(self, *args, **kwargs) -> None:
    _ORIGINAL_INIT(self, *args, **kwargs)
    plugin = _SIGNATURE.bind(self, *args, **kwargs).arguments.get("fsdp_plugin")
    # MULTI_CPU and no plugin kept: the state was just built by the gated branch (a second
    # AcceleratorState() in the same process finds distributed_type FSDP and changes nothing)
    if plugin is None or self.distributed_type != DistributedType.MULTI_CPU or hasattr(self, "fsdp_plugin"):
        return
    # the same three lines AcceleratorState.__init__ runs for MULTI_GPU and friends
    self.distributed_type = DistributedType.FSDP
    if self._mixed_precision != "no":
        plugin.set_mixed_precision(self._mixed_precision)
    self.fsdp_plugin = plugin
    # both shared dicts: AcceleratorState copied PartialState's at init and they are read separately
    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        shared["distributed_type"] = DistributedType.FSDP
        shared["device"] = torch.device("cpu")


def lift_cpu_fsdp_gate() -> None:
    """Install the patch described in the module docstring (idempotent; process-wide)."""
    AcceleratorState.__init__ = _init_keeping_fsdp_on_cpu


def restore_cpu_fsdp_gate() -> None:
    """Undo :func:`lift_cpu_fsdp_gate` (accelerate as shipped)."""
    AcceleratorState.__init__ = _ORIGINAL_INIT


def is_lifted() -> bool:
    return AcceleratorState.__init__ is _init_keeping_fsdp_on_cpu
