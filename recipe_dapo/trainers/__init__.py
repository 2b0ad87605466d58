"""The trainers that run DAPO on verl: ``classic`` (verl's ``RayPPOTrainer``) and ``v1`` (verl's v1 trainers), thin
adapters of verl's hooks onto the run object both hold (``recipe_dapo.run.recipe_run.RecipeRun``: sampler settings,
update guard, pre-emption, tracker, rollout liveness, recipe state and resume line, validation and step metrics,
overlong filter), and the table that chooses between them (``table``). ``docs/architecture.md`` lists the modules.

Nothing is imported here: ``table`` is read by the start-up rules before verl is imported.
"""
