"""``python -m recipe_dapo.compat``: print the list of sites where the recipe depends on other packages' internals
(``docs/compat.md`` is this output)."""

from recipe_dapo.compat import render

if __name__ == "__main__":
    print(render(), end="")
