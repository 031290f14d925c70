"""Other tools' memory estimators, reimplemented so the book can set them beside ours.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``) compares ``accelerate estimate-memory``
and DeepSpeed's ZeRO-3 estimator with ``smolfsdp.estimate.memory.estimate_memory``. Pure functions.

    python -c "from smolfsdp.measure import reference_estimates as r, params as p; print(r.accelerate_estimate(p.resolve_model_config('smollm3-3b')))"
"""

from __future__ import annotations

from smolfsdp.estimate.params import buffer_bytes, count_parameters
from smolfsdp.estimate.recipes import check_choice


def accelerate_estimate(config, dtype: str = "float32") -> dict[str, int]:
    """What ``accelerate estimate-memory`` prints, reimplemented (accelerate 1.15,
    accelerate/commands/estimate.py ``gather_data`` + ``estimate_training_usage``).

    It sizes the meta model in fp32 (parameters, tied once, plus buffers), takes the largest
    no-split layer, and for "Training using Adam" reports the *largest* of its components, not
    their sum: float32 -> ``step = 4 x model`` (16 B/param); float16 -> ``optimizer = 2 x fp32
    model`` (8 B/param). No activations, no sharding, no batch size.
    """
    check_choice(dtype, ("float32", "float16"), "accelerate dtype")
    counts = count_parameters(config)
    fp32 = counts.total * 4 + buffer_bytes(config)
    largest = max(counts.per_layer, counts.embedding) * 4
    if dtype == "float32":
        parts = {"model": fp32, "gradients": fp32, "optimizer": 2 * fp32, "step": 4 * fp32}
        size = fp32
    else:
        parts = {"model": fp32, "gradients": fp32 + fp32 // 2, "optimizer": 2 * fp32, "step": 2 * fp32}
        size, largest = fp32 // 2, largest // 2
    return {
        "total_bytes": size,
        "largest_layer_bytes": largest,
        "training_bytes": max(parts.values()),
        **parts,
    }


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = False,
    cpu_offload_params: bool = False,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> dict[str, int]:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py),
    reimplemented: per-GPU ``18 * params / gpus + 4 * largest_layer`` without offload (18 = fp16
    params 2 + fp16 grads 2 + fp32 master, m, v 12 + 2 for the fp32 gradient partition); model
    states only (no activations); host sized with a 1.5x buffer factor. ``largest_layer_params`` is
    the module with the most direct parameters (for SmolLM3: the embedding).
    """
    total_gpus = gpus_per_node * num_nodes
    largest = 4 * largest_layer_params
    if cpu_offload and cpu_offload_params:
        gpu, cpu = largest, total_params * 18 / num_nodes * additional_buffer_factor
    elif cpu_offload:
        gpu = largest + int(2 * total_params / total_gpus)
        cpu = total_params * 16 / num_nodes * additional_buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = largest_layer_params * 4 * gpus_per_node * additional_buffer_factor
    if not zero_init and cpu_offload:
        cpu = (
            total_params
            * max(4 * gpus_per_node, (18 if cpu_offload_params else 16) / num_nodes)
            * additional_buffer_factor
        )
    elif not zero_init:
        cpu = total_params * 4 * gpus_per_node * additional_buffer_factor
    return {"gpu_bytes": int(gpu), "cpu_bytes_per_node": int(cpu), "largest_layer_bytes": largest}
