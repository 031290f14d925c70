"""How a model is sharded: FSDP1, FSDP2, the mesh, LoRA adapters, the process group.

``fsdp2`` (``fully_shard`` per decoder layer: the FSDP2 wrap, the mesh shape for FULL/HYBRID/NO_SHARD),
``fsdp1`` (``FullyShardedDataParallel`` auto-wrap and TRL's ``fsdp_config``), ``lora`` (peft adapters
under FSDP, their export), ``shards`` (what a rank holds, activation checkpointing), ``distributed``
(process group set-up, collective timeouts named).

Layer: beside ``traces`` (neither imports the other), below ``checkpoint`` and ``measure``; may import
``models``, ``data``, ``config`` and the bottom modules.
"""
