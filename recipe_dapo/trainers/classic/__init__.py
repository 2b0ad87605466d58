"""DAPO on verl's classic ``RayPPOTrainer``: the trainer, its Ray task runner, the rollout replicas' protocol and the
seeded rollouts (per-response vLLM seeds and the agent loop that passes them on)."""
