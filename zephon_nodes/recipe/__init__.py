"""The recipe: what defines the data stream (datasets, tokenizer, mixture, operators, lanes).

One module per recipe table: ``tokenizer``, ``datasets``, ``work``, ``shuffle``, ``packing``,
``mixture``, ``operators``, ``image`` and ``chat``; ``recipe`` holds :class:`Recipe` (the
tables together, its checks, :meth:`Recipe.from_toml` and the fingerprint), ``canonical`` the
canonical JSON the fingerprint hashes, ``diff`` the fields two canonical forms differ in,
``bounds`` the range of every numeric setting, ``schedule`` mixture weights over training and
``registry`` the named user code a recipe may refer to.
"""

from zephon_nodes.recipe.datasets import DatasetSpec
from zephon_nodes.recipe.diff import diff_canonical
from zephon_nodes.recipe.mixture import MixtureSpec
from zephon_nodes.recipe.operators import OperatorSpec
from zephon_nodes.recipe.packing import PackSpec
from zephon_nodes.recipe.recipe import Recipe
from zephon_nodes.recipe.shuffle import ShuffleSpec
from zephon_nodes.recipe.tokenizer import TokenizerSpec
from zephon_nodes.recipe.work import WorkSpec

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
