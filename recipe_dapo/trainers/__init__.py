"""The trainers that run DAPO on verl: ``classic`` (verl's ``RayPPOTrainer``) and ``v1`` (verl's v1 trainers), thin
adapters of verl's hooks onto one run object both hold (``recipe_run.RecipeRun``: sampler settings, update guard,
pre-emption, tracker, rollout liveness, recipe state and resume line, validation and step metrics, overlong filter),
and the table that chooses between them (``table``). The run object's parts have their own modules here (step
metrics, checkpoint state, pre-emption, rollout health and liveness, validation metrics, node placement);
``docs/architecture.md`` lists them all.

Nothing is imported here: ``table`` is read by the start-up rules before verl is imported.
"""
