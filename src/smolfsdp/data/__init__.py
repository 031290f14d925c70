"""Data: rows from a file or the hub, turned into chat-formatted tokens with labels.

``files`` (the bundled sample, local .jsonl/.json/.csv/.parquet, hub data sets, UTF-8 checks), ``prepare``
(column mappings, chat template, too-long rows, train/eval split, ``prepare_data``).

Layer: beside ``models`` (neither imports the other), below ``sharding`` and ``traces``; may import only
``config`` and the bottom modules (errors, paths, secrets, quiet).
"""
