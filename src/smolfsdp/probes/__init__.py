"""The chapters' probes: experiments a chapter launches on CPU ranks and reads back, each a claim measured live.

``mechanics`` (what FSDP1 and FSDP2 do in one step on 2 ranks: sharding, collectives, state dicts, freezing),
``step`` (one FSDP2 step recorded four ways: who all-gathers what, when, and what it costs), ``dtype_rule``
(which mixes of parameter dtypes ``fully_shard`` accepts), ``measured`` (the estimator against counted bytes,
the communication model against a profiler trace), ``drills`` (a run stopped and resumed, a rank killed).
Each launches through ``smolfsdp.launch.probe`` (``run_probe``, ``read_results``; a probe module's ``main``
is ``probe_main``); what the chapters show of the results is in ``smolfsdp.book``.

    python -c "from smolfsdp.probes.dtype_rule import check_dtype_rule; print(check_dtype_rule('/tmp/dtype'))"

Layer: beside ``gotchas`` and ``gpu_check`` (none imports another), below ``seeds``, ``book`` and the CLI;
may import ``launch``, ``dryrun`` and every layer below them.
"""
