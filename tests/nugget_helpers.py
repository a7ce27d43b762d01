"""What the NUGGET test files share: the documents, and one training batch of them."""

from __future__ import annotations

TEXTS = [
    "the cat sat on the mat , and the dog barked .",
    "a much longer document : it has several clauses , some commas ; and then it ends , finally .",
    "",
    "short one .",
]


def batch_of(encoder, texts=TEXTS) -> dict:
    """The first autoencoding batch of `texts` (all of them, no noise), as the recipe builds it."""
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    examples = tokenize_examples(encoder, list(texts), None, 64)
    recipe = NuggetRecipe(encoder, examples, "ae", noise=0.0, batch_size=len(examples))
    return next(iter(recipe.batches(0)))
