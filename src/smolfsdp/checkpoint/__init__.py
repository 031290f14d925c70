"""Checkpoints: the on-disk format, atomic save and resume, verification, disk space, conversion.

``dcp`` (torch.distributed.checkpoint save/load, ``step-N/`` with a ``COMPLETE`` marker, keep-last-K,
resume checks, ``convert`` to ``model.safetensors``), ``verify`` (sizes and SHA-256 per file, DCP metadata
read through an allow-list), ``disk`` (bytes a run will write, free space).

Layer: beside ``measure`` (neither imports the other), below ``train``; may import ``sharding``,
``traces``, ``models``, ``data``, ``config`` and the bottom modules.
"""
