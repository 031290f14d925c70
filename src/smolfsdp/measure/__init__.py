"""What a run measures: timed steps, MFU, profiler traces, bytes held per rank, and the run folder.

``benchmark`` (timed steps, tokens/s, MFU against ``smolfsdp.estimate.flops``, peak memory, profiler traces,
bench.json), ``timing`` (CUDA-event step timer, the measured matmul ceiling), ``memory_measure`` (the bytes FSDP
state really occupies on each rank, beside ``smolfsdp.estimate.memory``), ``results`` (the run folder: writer
and reader).

Layer: beside ``checkpoint`` (neither imports the other), below ``train``, above ``estimate``; may import
``sharding``, ``traces``, ``models``, ``data``, ``config`` and the bottom modules.
"""
