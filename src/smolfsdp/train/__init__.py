"""The training engines: what each launched process runs.

``sft.train`` (one rank: join the group, run an engine, write the run folder), ``native`` (the plain
PyTorch loop: build, shard, optimizer, step, evaluate, save; its sharding stage in ``native_sharding``), ``trl_engine`` / ``trl_trainer`` /
``trl_callbacks`` (TRL's ``SFTTrainer`` with our FSDP settings), ``accelerate_cpu_fsdp`` (the one named
patch that lets accelerate shard on CPU).

Layer: below ``launch`` (a rank never launches); may import ``checkpoint``, ``measure``, ``sharding``,
``traces``, ``models``, ``data``, ``config`` and the bottom modules.
"""
