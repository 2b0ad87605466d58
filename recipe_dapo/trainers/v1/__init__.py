"""DAPO on verl 0.9.1's v1 trainer (``trainer.use_v1=true``): the replay buffer (``replay_buffer``), the trainer
registered with verl (``trainer``) and the Ray task runner (``task_runner``). Importing this package imports verl,
Ray and TransferQueue; the pure sampling logic stays in ``recipe_dapo.dynamic_sampling``."""
