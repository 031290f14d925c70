"""Throughput options of a run: packing, padding-free batches, the attention kernel, torch.compile, Liger
kernels, and the checks on them that the fields alone decide.

One source for the run config (``smolfsdp.config``: ``packing``, ``padding_free``, ``attn_implementation``,
``torch_compile``, ``use_liger_kernel``), both engines and the estimate. The names are TRL's ``SFTConfig`` /
transformers' ``TrainingArguments`` fields of the same name (TRL 1.16, transformers 5.x), so a TRL user reads
them as they know them. Checks that need the installed packages or the device run where a run starts
(``smolfsdp.launch.validate``).

    python -c "from smolfsdp.run_options import check_run_options; help(check_run_options)"
"""

from __future__ import annotations

from typing import Any

from smolfsdp.errors import ConfigError, did_you_mean

#: transformers' built-in attention implementations (``attn_implementation``); a hub kernel
#: (``kernels-community/...``) is also accepted by transformers and checked where a run starts.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def check_packing(cfg: Any) -> None:
    """Raise ConfigError for packing / padding-free settings that would let a row attend to another.

    A padding-free (or packed) micro-batch is one row whose rows are told apart only by ``position_ids`` that
    restart at 0 (``smolfsdp.data.packing``). transformers keeps them apart in its mask for ``sdpa``, ``eager``
    and ``flex_attention`` and through the varlen path for flash attention and hub kernels that export
    ``flash_attn_varlen_func`` (``integrations/hub_kernels.py``: ``load_and_register_attn_kernel``). A hub kernel
    named by its function (``org/name:function``) is registered with the flash attention mask, which is None for
    a batch without padding: the function gets no mask and no promise that it reads ``cu_seq_lens``, so it is
    refused here. (The other way rows meet, a KV cache, is ruled out in code: ``smolfsdp.train.steps.NO_CACHE``.)
    """
    name = cfg.attn_implementation
    if (cfg.packing or cfg.padding_free) and name is not None and "/" in name and ":" in name:
        what = "packing" if cfg.packing else "padding_free"
        raise ConfigError(
            f"{what}: true with attn_implementation={name!r}: transformers hands a kernel named by its function "
            "no mask, so the rows of a padding-free batch could attend to each other; use 'sdpa', "
            "'flash_attention_2' or the kernel repository without ':function', or set packing and padding_free "
            "to false."
        )


#: Attention implementations whose kernels take only fp16/bf16 inputs: with ``mixed_precision: no`` the model
#: computes in fp32 and flash-attn refuses its inputs at the first forward.
HALF_PRECISION_ATTENTION = ("flash_attention_2", "flash_attention_3")


def check_kernels(cfg: Any) -> None:
    """Raise ConfigError for kernel options the fields alone rule out: an unknown ``attn_implementation`` (hub
    kernels ``org/name`` pass here), flash-attention without ``mixed_precision: bf16`` (its kernels take fp16/bf16
    only), and ``torch_compile`` with native FSDP1 and ``use_orig_params: false`` (torch.compile traces the decoder
    layers' own parameters, which FSDP1 keeps only as views with ``use_orig_params=True``; the Trainer sets it).
    Whether the packages and a GPU are there is checked where a run starts (``smolfsdp.launch.kernel_checks``)."""
    name = cfg.attn_implementation
    if name is not None and name not in ATTN_IMPLEMENTATIONS and "/" not in name:
        raise ConfigError(
            f"attn_implementation={name!r} is not one transformers knows; use one of {ATTN_IMPLEMENTATIONS} or a "
            f"hub kernel such as kernels-community/flash-attn2.{did_you_mean(name, ATTN_IMPLEMENTATIONS)}"
        )
    if name in HALF_PRECISION_ATTENTION and cfg.mixed_precision != "bf16":
        raise ConfigError(
            f"attn_implementation={name} computes in fp16/bf16 only and mixed_precision={cfg.mixed_precision!r} "
            "runs the model in fp32; set mixed_precision: bf16, or attn_implementation: sdpa."
        )
    if cfg.torch_compile and cfg.engine == "native" and cfg.fsdp_version == 1 and not cfg.use_orig_params:
        raise ConfigError(
            "torch_compile with fsdp_version: 1 needs use_orig_params: true (torch.compile traces each decoder "
            "layer's own parameters; with use_orig_params false FSDP1 hides them in its FlatParameter); set "
            "use_orig_params: true, or fsdp_version: 2."
        )


def check_run_options(cfg: Any) -> None:
    """The checks of this module, in order (called by ``TrainConfig.__post_init__``)."""
    check_packing(cfg)
    check_kernels(cfg)
