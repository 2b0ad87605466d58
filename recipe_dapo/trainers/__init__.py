"""The trainers that run DAPO on verl: ``classic`` (verl's ``RayPPOTrainer``) and ``v1`` (verl's v1 trainers), the
table that chooses between them (``table``), and what both share: the sampler's settings and the scored-round
metrics (``step_metrics``), the recipe's checkpoint state (``checkpoint_state``), validation metrics
(``validation_metrics``).

Nothing is imported here: ``table`` is read by the start-up rules before verl is imported.
"""
