"""Starting a run: the checks composed before it starts, the torchrun launcher, and why a run failed.

``validate`` (config checks that need the model presets, the mesh or the launcher: :func:`validate.validate`),
``runner`` (``run``, ``preflight``, ``run_benchmark``: what chapters, tests and the CLI call), ``torchrun``
(the command, the subprocess, signals, elastic restart), ``checks`` (output folder, run lock, cores, memory,
GPUs, model against data), ``failures`` (torchrun's failure report in one line), ``processes`` (launched
processes in a process group of their own, stopped as a group), ``probe`` (the one way to launch a probe or the
gotchas on CPU ranks and read their results back), ``progress`` (what a captured run shows while it goes on:
rank 0's lines and bar, paths relative, no third-party warning; on by default in a Jupyter kernel).

Layer: below ``gotchas``, ``probes`` and ``gpu_check``; may import ``train``, ``checkpoint``, ``measure``, ``sharding``, ``traces``,
``models``, ``data``, ``config`` and the bottom modules (errors, paths, secrets, quiet).
"""
