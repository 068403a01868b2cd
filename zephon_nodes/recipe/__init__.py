"""The recipe: what defines the data stream (datasets, tokenizer, mixture, operators, lanes).

``spec`` holds the recipe objects and the fingerprint, ``schedule`` mixture weights over
training, ``registry`` the named user code a recipe may refer to.
"""

from zephon_nodes.recipe.spec import (
    DatasetSpec,
    MixtureSpec,
    OperatorSpec,
    PackSpec,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkSpec,
    diff_canonical,
)

__all__ = [
    "DatasetSpec",
    "MixtureSpec",
    "OperatorSpec",
    "PackSpec",
    "Recipe",
    "ShuffleSpec",
    "TokenizerSpec",
    "WorkSpec",
    "diff_canonical",
]
