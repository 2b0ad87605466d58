"""The trainers that run DAPO on verl: ``classic`` (verl's ``RayPPOTrainer``) and ``v1`` (verl's v1 trainers), thin
adapters of verl's hooks and loop events onto the run object both hold (``recipe_dapo.run.recipe_run.RecipeRun``,
whose lifecycle decides when the run stops, what it saves then and what it prints), the part both adapters share
(``adapter``: the run object and the trainer as the lifecycle sees it), and the table that chooses between them
(``table``). ``docs/architecture.md`` lists the modules.

Nothing is imported here: ``table`` is read by the start-up rules before verl is imported.
"""
