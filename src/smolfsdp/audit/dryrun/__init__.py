"""The full-size dry run: a run config's real model and real sharding code, on fake tensors.

PyTorch's ``FakeTensorMode`` gives tensors shapes, dtypes and devices but no storage, and a ``fake``
process group (``torch.testing._internal.distributed.fake_pg``) answers every collective at no cost,
so the SmolLM3-3B run of the book goes through the package's own code path (model from its config,
``train.native.shard_model``, the optimizer, ``train.steps``) on this CPU, in seconds to minutes,
while trackers count what one rank allocates (``FSDPMemTracker`` / ``MemTracker``), communicates and
computes (``FlopCounterMode``). Traced on fake tensors: what PyTorch allocates for the real model and
code, **not** a GPU measurement (see :data:`run.LABEL` for what a GPU changes).

``tracker`` (counting), ``dry_run`` (the dry run of a ``TrainConfig``), ``compare`` (the estimator held to
it), ``streams`` (the allocation order with its streams), ``gpu_path`` (the GPU's code path on fake tensors),
``published_replay`` (published runs traced and replayed). Part of ``smolfsdp.audit``: it runs ``train``'s
sharding and step functions, so it sits above ``train``; ``book`` and the CLI use it.

    smolfsdp dryrun --config configs/runs/smollm3_3b_medical.yaml [--gpus N] [--json]
"""
