"""FSDP2's root group stays gathered from forward to backward by default: 2L + 1 all-gathers per step.

``apply_fsdp2`` used to pass ``reshard_after_forward=True`` to the root too, which made torch reshard it
after forward and all-gather it again at once for backward (2L + 2 = 10 for the tiny model's 4 layers).
"""

import inspect

import torch
from torch.distributed.fsdp import fully_shard

from smolfsdp.estimate.comm import estimate_collectives
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.sharding.fsdp2 import apply_fsdp2


def test_apply_fsdp2_keeps_the_root_gathered_by_default():
    """The launched measurement is ``tests/test_figures_mechanisms.py::test_probe_counts_bytes_and_losses``
    (2 gloo ranks: 9 all-gathers with the root kept, 10 with it resharded, 5 reduce-scatters, the same
    loss, the root a DTensor between forward and backward only when resharded); it passes the flag
    explicitly, so the default the engines get is checked here."""
    default = inspect.signature(apply_fsdp2).parameters["root_reshard_after_forward"].default
    assert default is False


def test_the_communication_model_counts_2l_plus_1_gathers_with_the_root_kept():
    config = resolve_model_config("tiny")
    n = config.num_hidden_layers
    for root_reshard, gathers in ((False, 2 * n + 1), (True, 2 * n + 2)):
        coll = estimate_collectives(
            config, n_gpus=2, fsdp_version=2, mixed_precision="no", root_reshard_after_forward=root_reshard
        )
        assert coll.loc[coll["kind"].eq("all-gather"), "count"].sum() == gathers, root_reshard
    kept = estimate_collectives(config, n_gpus=2, fsdp_version=2, mixed_precision="no")  # None: the default
    assert kept.loc[kept["kind"].eq("all-gather"), "count"].sum() == 2 * n + 1


def test_torch_default_for_the_root_is_no_reshard():
    """What the default follows: ``fully_shard``'s None keeps the root gathered (torch's own heuristic)."""
    doc = inspect.getdoc(fully_shard)
    assert "set ``False`` for the root module" in doc
    assert torch.__version__.startswith("2.13")
