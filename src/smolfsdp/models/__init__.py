"""Building the model and tokenizer: presets, hub ids, local folders, the meta-device model, wrap classes.

``modeling`` (``load_tokenizer``, ``build_model``, ``build_meta_model``, the ``tiny`` SmolLM3 preset, the
decoder-layer class FSDP wraps).

Layer: beside ``data`` (neither imports the other), below ``sharding`` and ``traces``; may import only
``config`` and the bottom modules (errors, paths, secrets, quiet).
"""
