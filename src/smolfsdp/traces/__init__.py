"""Reading torch.profiler traces: the parser, event classes, intervals, collectives, per-step analysis.

``load`` (the streaming Chrome-trace parser: ``read_trace``, ``load_trace``; bounded input), ``classify``
(compute, communication, memory copies; ``collective_kind`` of a c10d op), ``intervals`` (union and overlap
of time spans), ``sanity`` (impossible times, device kinds not analysed, same-stream overlap: counted, noted,
left out), ``collectives`` (all-gathers per layer, prefetch), ``analysis`` (busy/idle, overlap, per-step summary:
``summarize_trace``).

Layer: beside ``sharding`` (neither imports the other), below ``checkpoint`` and ``measure``; may import
``models``, ``data``, ``config`` and the bottom modules (in practice none of ours).
"""
