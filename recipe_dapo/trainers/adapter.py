"""What both trainer adapters share on verl's side: :class:`HoldsRecipeRun`, their run object and the trainer as the
run's lifecycle sees it (``run.lifecycle.TrainerSteps``) on the names verl's two trainers have alike (``global_steps``,
``_save_checkpoint``, ``checkpoint_manager``)."""

from __future__ import annotations

from typing import Any

from recipe_dapo.run.recipe_run import RecipeRun


class HoldsRecipeRun:
    """The trainers' view of their :class:`~recipe_dapo.run.recipe_run.RecipeRun`: ``recipe`` (created from ``config``
    and ``tokenizer`` on first use), its run-wide state under the names both trainers and their tests use, and the
    lifecycle's protocol (``current_step``, ``replica_manager``, ``save_as``; each adapter adds ``rewind``)."""

    @property
    def recipe(self) -> RecipeRun:
        run = self.__dict__.get("_recipe_run")
        if run is None:
            run = self.__dict__["_recipe_run"] = RecipeRun(self.config, getattr(self, "tokenizer", None))
        return run

    update_guard = property(lambda self: self.recipe.update_guard,
                            lambda self, value: setattr(self.recipe, "update_guard", value))
    preemption = property(lambda self: self.recipe.preemption,
                          lambda self, value: setattr(self.recipe, "preemption", value))
    stopped_by = property(lambda self: self.recipe.stopped_by,
                          lambda self, value: setattr(self.recipe, "stopped_by", value))

    # ------------------------------------------------------------------ ``run.lifecycle.TrainerSteps``

    @property
    def current_step(self) -> int:
        return int(self.global_steps)

    @property
    def replica_manager(self) -> Any:
        return getattr(self, "checkpoint_manager", None)

    def save_as(self, step: int) -> None:
        """verl's checkpoint (with the recipe's state) as step ``step``: verl's save names the folder after
        ``global_steps``, which is ``step`` while it runs."""
        current = self.global_steps
        self.global_steps = step
        try:
            self._save_checkpoint()
        finally:
            self.global_steps = current
