"""Measurement and models of cost: memory, time, communication, hardware, run folders.

``memory`` (the per-rank memory formula: parameters, gradients, optimizer state, activations),
``memory_measure`` (the same bytes counted on a real sharded model), ``benchmark`` (timed steps, MFU,
profiler traces, bench.json), ``comm`` / ``comm_trace`` (the communication model and its check against a
trace), ``hardware`` (GPU and network table), ``results`` (the run folder: writer and reader).

Layer: beside ``checkpoint`` (neither imports the other), below ``train``; may import ``sharding``,
``traces``, ``models``, ``data``, ``config`` and the bottom modules.
"""
