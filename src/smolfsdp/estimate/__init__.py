"""The estimator: what a run will hold, send and take, computed from a model config before anything runs.

Pure functions of a config (parameters counted on the meta device, no weights, no GPU): ``memory``
(``estimate_memory``: per-rank bytes component by component, from ``params`` counts, ``layout`` shard sizes,
``activations``, ``recipes`` bytes per parameter, the step's ``moments``, the ``loss_path``, the caching
allocator's ``reserved`` pools), ``hardware`` (the GPU table and the one fit ``verdict``), ``recommend`` ("Does
FSDP fit?"), ``recipe_peak`` (the book recipe's peak), ``flops`` (model FLOPs per token), ``recompute`` (what
activation checkpointing runs again), ``comm`` / ``cluster`` / ``scaling`` (collectives, their cost, step time),
``calibration`` (the step-time rate, read from a committed file that ``smolfsdp.audit`` fits),
``reference_estimates`` (accelerate's and DeepSpeed's estimators, to compare), ``token_share`` (real tokens
padded vs packed, TRL's BFD) on ``seed_lengths`` (row lengths like the seed data set's, derived from published
pieces).

Layer: below ``measure`` and ``checkpoint`` (they compare runs and files with it); may import ``sharding``,
``traces``, ``models``, ``data``, ``config`` and the bottom modules. The checks of these numbers against dry
runs, published runs and a GPU live above, in ``smolfsdp.audit``.
"""
